-- budgetgate inspect: read budgets without changing them.
-- Mirrors MemoryStore::inspect_sync (src/reserve/memory.rs); lib.lua is prepended.
--
-- KEYS[1..N]     budget keys
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- then 3 fields per key: kind, a, b (as in spec_from_argv)
--
-- Reply (strings): {now, remaining_1, reset_1 µs, ..., remaining_N, reset_N}
-- Writes nothing.

local now = clock(ARGV[1])
local out = { s(now) }
for i = 1, #KEYS do
  local p = 2 + (i - 1) * 3
  local sp = { key = KEYS[i], kind = ARGV[p], a = num(ARGV[p + 1], 'a'), b = ARGV[p + 2] }
  if sp.kind == 'B' then
    sp.b = num(sp.b, 'burst')
  end
  local rem, reset = state_of(sp, now)
  out[#out + 1] = s(rem)
  out[#out + 1] = s(reset)
end
return out
