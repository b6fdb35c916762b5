-- budgetgate lower: follow a provider's own view of a deployment's budget.
-- Mirrors MemoryStore::lower_sync (src/budget/memory/); lib.lua is prepended.
--
-- KEYS[1]        a bucket key
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2], [3]   per_minute (tokens or requests/min), burst of the bucket
--                under the current policy
-- ARGV[4]        at most this many whole tokens (or requests) may remain
--
-- Reply (strings): {now, remaining} after lowering. The level only ever
-- goes down (never raised): the provider may know of spending the gateway
-- does not see, never of spare quota it has not refilled itself.
-- Writes the bucket with its usual TTL (until full again + margin).

local now = clock(ARGV[1])
local per_minute = num(ARGV[2], 'per_minute')
local burst = num(ARGV[3], 'burst')
local at_most = num(ARGV[4], 'at_most')
if at_most > MAX_COST then
  at_most = MAX_COST
end
local level, last = bucket_at(call('GET', KEYS[1]), burst, now)
if level > at_most * UNITS then
  level = at_most * UNITS
  call('SET', KEYS[1], pack('<dddd', level, last, per_minute, burst), 'PX',
    ttl_ms(refill_wait(burst * UNITS - level, per_minute, now, last)))
end
return { s(now), s(fdiv(level, UNITS)) }
