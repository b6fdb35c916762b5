-- budgetgate extend: debit more tokens from every token budget of a hold.
-- Mirrors MemoryStore::extend_sync (src/reserve/memory/); lib.lua is prepended.
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
-- + margin; hold SET PX until its expiry + margin (res, the quota debits and
-- the extension list updated).

local now = clock(ARGV[1])
local want = num(ARGV[3], 'want')
if want > MAX_COST then
  want = MAX_COST
end

local raw = load_all()
local h, early = hold_for_update(raw[KEYS[1]], now, KEYS)
if h == nil then
  return early
end

local grant = want
local tight, tight_avail = nil, nil
local lines = {}
for i, kind, ref, a, b, d in live_lines(h.live) do
  local ln = { i = tonumber(i), key = KEYS[i + 1], kind = kind, ref = ref, a = tonumber(a), b = b, d = d }
  lines[#lines + 1] = ln
  if kind == 'B' or kind == 'Q' then
    local avail
    if kind == 'B' then
      ln.b = tonumber(b)
      avail = fdiv((bucket_at(raw[ln.key], ln.b, now)), UNITS)
    else
      avail = ln.a - quota_used(raw[ln.key], (window(b, now)))
    end
    if tight == nil or avail < tight_avail then
      tight, tight_avail = ln, avail
    end
    grant = math.min(grant, math.max(avail, 0))
  end
end

if grant == 0 and want > 0 then
  local ln = tight
  local retry, reset
  if ln.kind == 'B' then
    local level, last = bucket_at(raw[ln.key], ln.b, now)
    retry = refill_wait(UNITS - level, ln.a, now, last)
    reset = refill_wait(ln.b * UNITS - level, ln.a, now, last)
  else
    local _, wend = window(ln.b, now)
    retry, reset = wend - now, wend - now
  end
  return { 'X', s(now), s(ln.i - 1), s(tight_avail), s(retry), s(reset) }
end

local live = {}
for _, ln in ipairs(lines) do
  local key, d = ln.key, ln.d
  if ln.kind == 'B' then
    local level, last = bucket_at(raw[key], ln.b, now)
    -- grant ≤ what every budget has: the floor is never reached.
    level = bucket_debit(level, grant * UNITS)
    local v = pack('<dddd', level, last, ln.a, ln.b)
    call('SET', key, v, 'PX', ttl_ms(refill_wait(ln.b * UNITS - level, ln.a, now, last)))
    raw[key] = v
  elseif ln.kind == 'Q' then
    local w, wend = window(ln.b, now)
    local v = pack('<dd', w, quota_used(raw[key], w) + grant)
    call('SET', key, v, 'PX', ttl_ms(wend - now))
    raw[key] = v
    if d ~= '' then
      d = d .. ','
    end
    d = d .. s(w) .. ':' .. s(grant)
  end
  live[#live + 1] = fmt('%d %s %s %d %s %s;', ln.i, ln.kind, ln.ref, ln.a, tostring(ln.b), d)
end
local head = string.gsub(h.head, '^(%d+ )%d+', '%1' .. s(h.res + grant), 1)
local ext = s(now) .. ':' .. s(grant)
if h.ext ~= '' then
  ext = h.ext .. ' ' .. ext
end
call('SET', KEYS[1], '0 ' .. head .. ' 0 0 0\n' .. table.concat(KEYS, ' ', 2) .. '\n'
  .. table.concat(live) .. '\n' .. ext .. '\n' .. string.sub(h.raw, h.rest_at), 'PX', ttl_ms(h.exp - now))
return { 'E', s(now), s(grant) }
