-- budgetgate inspect: read budgets without changing them.
-- Mirrors MemoryStore::inspect_sync (src/budget/memory/); lib.lua is prepended.
--
-- KEYS[1..N]     budget keys
-- KEYS[N+1..]    the previous key layout's counter of each quota, in order
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- then 3 fields per key: kind, a, b (as in reserve.lua: 'B' per_minute
-- burst | 'Q' limit 'D'/'M'/'F'/'H'/'W' | 'C' max unused)
--
-- Reply (strings): {now, remaining_1, reset_1 µs, ..., remaining_N, reset_N,
-- then for each rolling window, in order: slide µs, slide units}
-- (remaining whole tokens/requests/slots, floor; reset µs until a bucket is
-- full again, until a quota window ends, 0 for concurrency; slide: when the
-- oldest units still counted slide out and how many, 0 0 when empty)
-- Reads every string key with one MGET, each slot set with ZCOUNT.
-- Writes nothing.

local now = clock(ARGV[1])
local raw = load_all()
local out = { s(now) }
local slides = {}
local n = (#ARGV - 1) / 3
local q = n
for i = 1, n do
  local p = 2 + (i - 1) * 3
  local key, kind, a, b = KEYS[i], ARGV[p], num(ARGV[p + 1], 'a'), ARGV[p + 2]
  local rem, reset
  if kind == 'B' then
    local burst = num(b, 'burst')
    local level, last = bucket_at(raw[key], burst, now)
    rem, reset = fdiv(level, UNITS), refill_wait(burst * UNITS - level, a, now, last)
  elseif kind == 'Q' and ROLL[b] ~= nil then
    q = q + 1
    local total, e = roll_at(raw[key], b, now)
    rem, reset = a - total, roll_until_empty(e, b, now)
    -- The oldest non-empty sub-bucket still counted (Rolling::next_slide).
    local sin, sunits, pos, r = 0, 0, 1, ROLL[b]
    while pos < #e do
      local sb, amount = unpack_('<dd', e, pos)
      if amount > 0 then
        sin, sunits = math.max((sb + r[2] + 1) * r[1] - now, 0), amount
        break
      end
      pos = pos + 16
    end
    slides[#slides + 1] = s(sin)
    slides[#slides + 1] = s(sunits)
  elseif kind == 'Q' then
    q = q + 1
    local lv = KEYS[q] and raw[KEYS[q]]
    local w, wend = window(b, now, raw[key] or lv)
    rem, reset = a - quota_used_at(raw[key], lv, w), wend - now
  else
    rem, reset = a - call('ZCOUNT', key, '(' .. s(now), '+inf'), 0
  end
  out[#out + 1] = s(rem)
  out[#out + 1] = s(reset)
end
for _, v in ipairs(slides) do
  out[#out + 1] = v
end
return out
