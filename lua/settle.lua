-- budgetgate settle: apply a hold's final usage exactly once.
-- Mirrors MemoryStore::settle_sync (src/reserve/memory.rs); lib.lua is prepended.
--
-- KEYS[1]        the hold
-- KEYS[2..N+1]   the hold's budget keys, in the hold's line order
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2]        reservation id
-- ARGV[3]        actual tokens used (prompt + completion)
-- ARGV[4]        '1' when the upstream failed before any output (refund
--                upstream budgets too, even where refund_unused is off)
--
-- Refunds reserved − actual to every refundable token budget (never above
-- capacity; a quota only to the window its debits went to, if it is the
-- current one), charges actual − reserved as debt (to the current window),
-- frees the slots, and marks the hold settled (kept until it expires, so a
-- retried settle answers 'S' and a retried reserve still replays).
--
-- Reply (strings):
--   {'T', now, reserved, refunded, debt}           settled now, tokens
--   {'U', now} unknown or expired hold   {'S', now} already settled
--   {'K', now} KEYS[2..] do not match the hold's keys (refresh and retry)
--
-- Writes: buckets SET PX until full + margin; quotas SET PX until window end
-- + margin; slots ZREM (the set keeps its TTL; Redis deletes an empty set);
-- hold SET PX until its expiry + margin.

local now = clock(ARGV[1])
local id = ARGV[2]
local actual = num(ARGV[3], 'actual')
local failed = ARGV[4] == '1'

local h, early = hold_for_update(now)
if h == nil then
  return early
end

h.st = '1'
local reserved = tonumber(h.res)
local unused = math.max(reserved - actual, 0)
local debt = math.max(actual - reserved, 0)
local refunded = 0
for _, line in ipairs(h.lines) do
  local sp = line_spec(line)
  if sp.kind == 'C' then
    redis.call('ZREM', sp.key, id)
    slots_purge(sp.key, now)
  elseif sp.tok then
    local refundable = sp.ref or failed
    if sp.kind == 'B' then
      local b = bucket_load(sp.key, sp.a, sp.b, now)
      if unused > 0 and refundable then
        bucket_credit(b, unused)
        refunded = unused
      end
      if debt > 0 then
        bucket_debit(b, debt)
      end
      bucket_save(sp.key, b)
    else
      local w = window_id(sp.b, now)
      local used = quota_used(sp.key, w)
      if unused > 0 and refundable then
        local here = 0
        if type(line.d) == 'table' then
          for _, d in ipairs(line.d) do
            if tonumber(d[1]) == w then
              here = here + tonumber(d[2])
            end
          end
        end
        used = math.max(used - math.min(unused, here), 0)
        refunded = unused
      end
      if debt > 0 then
        used = used + debt
      end
      quota_save(sp.key, sp.b, w, used, now)
    end
  end
end
h.snow = s(now)
h.refunded = s(refunded)
h.debt = s(debt)
hold_save(KEYS[1], h, now)
return { 'T', s(now), s(reserved), s(refunded), s(debt) }
