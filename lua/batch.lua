-- budgetgate batch: reservations and settlements of many requests in one
-- atomic call, applied in order, exactly as if each were its own call.
-- lib.lua, reserve.lua and settle.lua are prepended (src/budget/redis/scripts.rs).
--
-- Why: every call pays its own dispatch, and every item used to write each
-- budget it touched. Here the keys are read once per batch (one MGET), a
-- budget shared by many items is written once (lib.lua's put/flush), and a
-- slot set's TTL is set once: under load most of a reservation's Redis
-- time was those writes.
--
-- KEYS           every item's keys, item after item (each item's own KEYS
--                layout: reserve.lua, settle.lua)
-- ARGV[1]        number of items N
-- ARGV[2..]      3 fields per item: op ('R' reserve | 'S' settle), number
--                of keys, number of arguments
-- then every item's arguments, item after item (its own ARGV layout)
--
-- Reply: one element per item, in order: the item's own reply as one
-- string of words (lib.lua's words), or {'!', message} when that item
-- raised an error (it wrote nothing; the other items are unaffected).

local n = num(ARGV[1], 'items')
local items = {}
local kp, ap = 1, 2 + 3 * n
for j = 1, n do
  local h = 2 + 3 * (j - 1)
  local nk, na = num(ARGV[h + 1], 'item keys'), num(ARGV[h + 2], 'item args')
  local k, a = {}, {}
  for x = 1, nk do
    k[x] = KEYS[kp + x - 1]
  end
  for x = 1, na do
    a[x] = ARGV[ap + x - 1]
  end
  kp, ap = kp + nk, ap + na
  items[j] = { ARGV[h], k, a }
end

-- Every string key of the batch in one read.
load(KEYS)

local out = {}
for j = 1, n do
  local op, k, a = items[j][1], items[j][2], items[j][3]
  local fn
  if op == 'R' then
    fn = reserve
  elseif op == 'S' then
    fn = settle
  end
  local ok, r
  if fn == nil then
    ok, r = false, 'unknown batch op ' .. tostring(op)
  else
    ok, r = pcall(fn, k, a)
  end
  if ok then
    out[j] = words(r)
  else
    if type(r) == 'table' then
      r = r.err or 'error'
    end
    out[j] = { '!', tostring(r) }
  end
end
flush()
return out
