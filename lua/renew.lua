-- budgetgate renew: extend the concurrency leases of a live hold.
-- Mirrors MemoryStore::renew_sync (src/reserve/memory.rs); lib.lua is prepended.
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
-- Writes: slots ZADD XX + PEXPIRE until the longest lease ends + margin.
-- The hold is not written.

local now = clock(ARGV[1])
local id = ARGV[2]

local h, early = hold_for_update(now)
if h == nil then
  return early
end

local lease_until = now + tonumber(h.lease)
for _, line in ipairs(h.lines) do
  if line.kind == 'C' then
    local l = lease_of(line.k, id)
    if l ~= nil and l > now then
      redis.call('ZADD', line.k, 'XX', s(lease_until), id)
    end
    slots_purge(line.k, now)
    slots_expire(line.k, now)
  end
end
return { 'R', s(now), s(lease_until) }
