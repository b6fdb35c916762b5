-- budgetgate lower: follow a provider's own view of a deployment's budget.
-- Mirrors MemoryStore::lower_sync (src/reserve/memory.rs); lib.lua is prepended.
--
-- KEYS[1]        a bucket key
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2], [3]   per_minute, burst of the bucket under the current policy
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
local b = bucket_load(KEYS[1], per_minute, burst, now)
if b.level > at_most * UNITS then
  b.level = at_most * UNITS
  bucket_save(KEYS[1], b)
end
return { s(now), s(bucket_available(b)) }
