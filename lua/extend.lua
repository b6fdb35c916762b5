-- budgetgate extend: debit more tokens from every token budget of a hold.
-- Mirrors MemoryStore::extend_sync (src/reserve/memory.rs); lib.lua is prepended.
--
-- KEYS[1]        the hold
-- KEYS[2..N+1]   the hold's budget keys, in the hold's line order
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2]        reservation id
-- ARGV[3]        tokens wanted
--
-- Grants all of `want` when every token budget admits it, else the largest
-- amount all admit (≥ 1); when even 1 token does not fit, nothing is written.
-- Quota extensions go to the window current now.
--
-- Reply (strings):
--   {'E', now, granted}                              extended by `granted` tokens
--   {'X', now, line index (0-based), available, retry_after µs (for 1 token), reset µs}
--                                                    exhausted: the tightest budget
--   {'U', now} unknown or expired hold   {'S', now} already settled
--   {'K', now} KEYS[2..] do not match the hold's keys (refresh and retry)
--
-- Writes: buckets SET PX until full + margin; quotas SET PX until window end
-- + margin; hold SET PX until its expiry + margin.

local now = clock(ARGV[1])
local want = num(ARGV[3], 'want')

local h, early = hold_for_update(now)
if h == nil then
  return early
end

local grant = want
local tight_i, tight_avail = nil, nil
local specs = {}
for i, line in ipairs(h.lines) do
  local sp = line_spec(line)
  specs[i] = sp
  if sp.tok then
    local avail = available(sp, now)
    if tight_i == nil or avail < tight_avail then
      tight_i, tight_avail = i, avail
    end
    grant = math.min(grant, math.max(avail, 0))
  end
end

if grant == 0 and want > 0 then
  local sp = specs[tight_i]
  local _, reset = state_of(sp, now)
  return { 'X', s(now), s(tight_i - 1), s(tight_avail), s(wait_for(sp, 1, now)), s(reset) }
end

for i, sp in ipairs(specs) do
  if sp.tok then
    if sp.kind == 'B' then
      local b = bucket_load(sp.key, sp.a, sp.b, now)
      bucket_debit(b, grant)
      bucket_save(sp.key, b)
    elseif sp.kind == 'Q' then
      local w = window_id(sp.b, now)
      quota_save(sp.key, sp.b, w, quota_used(sp.key, w) + grant, now)
      local d = h.lines[i].d
      if type(d) ~= 'table' then
        d = {}
      end
      d[#d + 1] = { s(w), s(grant) }
      h.lines[i].d = d
    end
  end
end
h.res = s(tonumber(h.res) + grant)
local ext = h.ext
if type(ext) ~= 'table' then
  ext = {}
end
ext[#ext + 1] = { s(now), s(grant) }
h.ext = ext
hold_save(KEYS[1], h, now)
return { 'E', s(now), s(grant) }
