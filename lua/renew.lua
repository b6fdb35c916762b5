-- budgetgate renew: extend the concurrency leases of a live hold.
-- Mirrors MemoryStore::renew_sync (src/budget/memory/); lib.lua is prepended.
--
-- KEYS[1]        the hold
-- KEYS[2..N+1]   the hold's budget keys, in the hold's line order
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2]        reservation id
--
-- A lease that already expired stays expired: renewing it could exceed the
-- limit, since its slot may have been given to another request.
--
-- Reply (strings):
--   {'R', now, lease_until µs}
--   {'U', now} unknown or expired hold   {'S', now} already settled
--   {'K', now} KEYS[2..] do not match the hold's keys (refresh and retry)
--
-- Writes: slots ZADD XX + ZREMRANGEBYSCORE of expired leases + PEXPIRE until
-- the longest lease ends + margin. The hold is not written.

local now = clock(ARGV[1])
local id = ARGV[2]

local h, early = hold_for_update(call('GET', KEYS[1]), now, KEYS)
if h == nil then
  return early
end

-- TTL: until the longest lease ends + margin (an empty set is deleted by Redis).
local function slots_expire(key)
  local top = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] then
    call('PEXPIRE', key, ttl_ms(tonumber(top[2]) - now))
  end
end

local lease_until = now + tonumber(h.lease)
for i, _, kind in live_lines(h.live) do
  if kind == 'C' then
    local key = KEYS[i + 1]
    local l = call('ZSCORE', key, id)
    if l and tonumber(l) > now then
      call('ZADD', key, 'XX', s(lease_until), id)
    end
    call('ZREMRANGEBYSCORE', key, '-inf', s(now))
    slots_expire(key)
  end
end
return { 'R', s(now), s(lease_until) }
