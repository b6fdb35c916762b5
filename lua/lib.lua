-- budgetgate: shared Lua library, prepended to every script at build time
-- (src/reserve/redis.rs concatenates lib.lua with reserve.lua, extend.lua,
-- renew.lua, settle.lua and inspect.lua; each result is one EVALSHA script).
--
-- It mirrors, line for line, the Rust reference in src/reserve/bucket.rs
-- (token buckets), src/reserve/calendar.rs (UTC quota windows) and the
-- decisions of src/reserve/memory.rs (DESIGN section 2).
--
-- Numbers: Lua 5.1 numbers are doubles. Every value here is an integer below
-- 2^53 (bucket levels are at most 3e15 units in magnitude, times below 2e15 µs),
-- so additions, subtractions and products are exact; only division needs care,
-- see fdiv. Every number crosses the script boundary as a decimal integer
-- string (s() to write, tonumber() to read), never as a Lua number reply.
--
-- Stored values (every key is written with a TTL, see the *_save functions):
--   bucket  string "<level units> <last µs> <per_minute> <burst>"
--   quota   string "<window id> <used>"
--   slots   sorted set: member = reservation id, score = lease end (UTC µs)
--   hold    JSON (cjson), every number a decimal string; see hold_* below

-- Units per token: 60 s × 1,000,000 µs, so one µs of refill at L tokens/min adds L units.
local UNITS = 60000000
-- Microseconds per UTC day.
local DAY = 86400000000
-- Every TTL gets this margin (ms) past the moment the key stops mattering, so
-- a key is never dropped while its logical state still differs from "absent".
local MARGIN_MS = 60000

-- Floor of a / b for b > 0, exact for |a| < 2^53. math.floor(a / b) alone can
-- be off by one when a / b rounds to the next integer; the remainder corrects it.
local function fdiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- Ceiling of a / b for b > 0 (a may be negative), like bucket::ceil_div.
local function cdiv(a, b)
  return -fdiv(-a, b)
end

-- Decimal integer string of an integral number ("-0" never appears).
local function s(x)
  if x == 0 then
    return '0'
  end
  return string.format('%.0f', x)
end

local function num(x, what)
  local n = tonumber(x)
  if n == nil then
    error('budgetgate: bad number for ' .. what .. ': ' .. tostring(x))
  end
  return n
end

-- Store time, UTC µs: the explicit ARGV value when the caller passes one
-- (only test builds do), else Redis TIME, one clock for the whole fleet.
local function clock(arg)
  if arg ~= nil and arg ~= '' then
    return num(arg, 'now')
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- TTL in ms (≥ 1 + margin) for a key that stops mattering `micros` from now.
local function ttl_ms(micros)
  if micros < 0 then
    micros = 0
  end
  return cdiv(micros, 1000) + MARGIN_MS
end

---------------------------------------------------------------- buckets

local function refill(level, elapsed, rate, cap)
  if level >= cap then
    return level
  end
  local need = cap - level
  local max_elapsed = cdiv(need, rate)
  if elapsed > max_elapsed then
    elapsed = max_elapsed
  end
  return math.min(level + elapsed * rate, cap)
end

-- BucketState::advance: refill at the stored rate up to the stored capacity,
-- then adopt the new policy (a lower burst clamps; a higher one grants nothing).
local function bucket_advance(b, per_minute, burst, now)
  local t = math.max(now, b.last)
  local level = refill(b.level, t - b.last, b.per_minute, b.burst * UNITS)
  level = math.min(level, burst * UNITS)
  return { level = level, last = t, per_minute = per_minute, burst = burst }
end

-- The bucket at `key` brought to `now` under (per_minute, burst); full when absent.
local function bucket_load(key, per_minute, burst, now)
  local v = redis.call('GET', key)
  if not v then
    return { level = burst * UNITS, last = now, per_minute = per_minute, burst = burst }
  end
  local l, t, p, b = string.match(v, '^(%-?%d+) (%d+) (%d+) (%d+)$')
  if not l then
    error('budgetgate: bad bucket state at ' .. key)
  end
  local stored = { level = tonumber(l), last = tonumber(t), per_minute = tonumber(p), burst = tonumber(b) }
  return bucket_advance(stored, per_minute, burst, now)
end

local function bucket_available(b)
  return fdiv(b.level, UNITS)
end

local function bucket_wait_for(b, cost)
  local need = cost * UNITS - b.level
  if need <= 0 then
    return 0
  end
  return cdiv(need, b.per_minute)
end

local function bucket_until_full(b)
  local need = b.burst * UNITS - b.level
  if need <= 0 then
    return 0
  end
  return cdiv(need, b.per_minute)
end

local function bucket_debit(b, tokens)
  b.level = math.max(b.level - tokens * UNITS, -(b.burst * UNITS))
end

local function bucket_credit(b, tokens)
  b.level = math.min(b.level + tokens * UNITS, b.burst * UNITS)
end

-- TTL: until the bucket is full again (an absent bucket reads as full) + margin.
local function bucket_save(key, b)
  local v = s(b.level) .. ' ' .. s(b.last) .. ' ' .. s(b.per_minute) .. ' ' .. s(b.burst)
  redis.call('SET', key, v, 'PX', ttl_ms(bucket_until_full(b)))
end

---------------------------------------------------------------- calendar

local function civil_from_days(z)
  z = z + 719468
  local era = fdiv(z, 146097)
  local doe = z - era * 146097
  local yoe = fdiv(doe - fdiv(doe, 1460) + fdiv(doe, 36524) - fdiv(doe, 146096), 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + fdiv(yoe, 4) - fdiv(yoe, 100))
  local mp = fdiv(5 * doy + 2, 153)
  local m
  if mp < 10 then
    m = mp + 3
  else
    m = mp - 9
  end
  if m <= 2 then
    y = y + 1
  end
  return y, m
end

local function days_from_civil(y, m, d)
  if m <= 2 then
    y = y - 1
  end
  local era = fdiv(y, 400)
  local yoe = y - era * 400
  local mp
  if m > 2 then
    mp = m - 3
  else
    mp = m + 9
  end
  local doy = fdiv(153 * mp + 2, 5) + d - 1
  local doe = yoe * 365 + fdiv(yoe, 4) - fdiv(yoe, 100) + doy
  return era * 146097 + doe - 719468
end

-- Window::id: days since the epoch ('D') or year × 12 + month − 1 ('M').
local function window_id(w, now)
  local day = fdiv(now, DAY)
  if w == 'D' then
    return day
  end
  local y, m = civil_from_days(day)
  return y * 12 + m - 1
end

-- Window::end: exclusive end of the window containing now, UTC µs.
local function window_end(w, now)
  local day = fdiv(now, DAY)
  if w == 'D' then
    return (day + 1) * DAY
  end
  local y, m = civil_from_days(day)
  if m == 12 then
    y, m = y + 1, 1
  else
    m = m + 1
  end
  return days_from_civil(y, m, 1) * DAY
end

---------------------------------------------------------------- quotas

-- Tokens (or requests) used in window `w` (0 when the stored counter is of another window).
local function quota_used(key, w)
  local v = redis.call('GET', key)
  if not v then
    return 0
  end
  local sw, su = string.match(v, '^(%d+) (%d+)$')
  if not sw then
    error('budgetgate: bad quota state at ' .. key)
  end
  if tonumber(sw) == w then
    return tonumber(su)
  end
  return 0
end

-- TTL: until the end of the window + margin (a later window starts at 0 anyway).
local function quota_save(key, window, w, used, now)
  redis.call('SET', key, s(w) .. ' ' .. s(used), 'PX', ttl_ms(window_end(window, now) - now))
end

---------------------------------------------------------------- concurrency

local function live_slots(key, now)
  return redis.call('ZCOUNT', key, '(' .. s(now), '+inf')
end

local function lease_of(key, id)
  local v = redis.call('ZSCORE', key, id)
  if not v then
    return nil
  end
  return tonumber(v)
end

-- Drops expired leases (they count for nothing) so the set does not grow.
local function slots_purge(key, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', s(now))
end

-- TTL: until the longest lease ends + margin (an empty set is deleted by Redis).
local function slots_expire(key, now)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] then
    redis.call('PEXPIRE', key, ttl_ms(tonumber(top[2]) - now))
  end
end

---------------------------------------------------------------- budgets

-- A budget as passed by Rust (8 ARGV fields from position p) or stored in a hold line:
--   kind 'B' (bucket: a = per_minute, b = burst), 'Q' (quota: a = limit,
--   b = 'D' | 'M'), 'C' (concurrency: a = max slots, b unused);
--   cost (this request's debit in the budget's unit), tok ('1' when the
--   budget counts tokens), ref ('1' when unused tokens are refunded), meta
--   (opaque to Lua: scope and name for the Rust side), sh ('1' for a shadow
--   budget: debited when it admits, a refusal only reported, never enforced).
local function spec_from_argv(key, argv, p)
  local sp = {
    key = key,
    kind = argv[p],
    a = num(argv[p + 1], 'a'),
    b = argv[p + 2],
    cost = num(argv[p + 3], 'cost'),
    tok = argv[p + 4] == '1',
    ref = argv[p + 5] == '1',
    meta = argv[p + 6],
    sh = argv[p + 7] == '1',
  }
  if sp.kind == 'B' then
    sp.b = num(sp.b, 'burst')
  end
  return sp
end

local function capacity(sp)
  if sp.kind == 'B' then
    return sp.b
  end
  return sp.a
end

-- Whole units available now (floor; negative in debt).
local function available(sp, now)
  if sp.kind == 'B' then
    return bucket_available(bucket_load(sp.key, sp.a, sp.b, now))
  elseif sp.kind == 'Q' then
    return sp.a - quota_used(sp.key, window_id(sp.b, now))
  end
  return sp.a - live_slots(sp.key, now)
end

-- µs until `cost` fits: exact ceiling for buckets, the window end for quotas,
-- 0 for concurrency (the caller applies its hint).
local function wait_for(sp, cost, now)
  if sp.kind == 'B' then
    return bucket_wait_for(bucket_load(sp.key, sp.a, sp.b, now), cost)
  elseif sp.kind == 'Q' then
    return window_end(sp.b, now) - now
  end
  return 0
end

-- (remaining, reset µs) as in MemoryStore::state_of.
local function state_of(sp, now)
  if sp.kind == 'B' then
    local b = bucket_load(sp.key, sp.a, sp.b, now)
    return bucket_available(b), bucket_until_full(b)
  elseif sp.kind == 'Q' then
    return sp.a - quota_used(sp.key, window_id(sp.b, now)), window_end(sp.b, now) - now
  end
  return sp.a - live_slots(sp.key, now), 0
end

---------------------------------------------------------------- holds
-- Hold JSON: { v = "1", id, now (admission µs), exp (logical expiry µs),
--   lease (µs), res (tokens reserved incl. extensions), st ("0" | "1" settled),
--   cand (chosen candidate), adm (flat remaining/reset pairs of the admission),
--   lines = [{ k, kind, a, b, c (cost), tok, ref, m (meta), d = [[window, amount]...] }],
--   ext = [[now, granted]...], and once settled: snow, refunded, debt }.

local function hold_load(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil
  end
  return cjson.decode(raw)
end

-- TTL: until the hold's logical expiry + margin.
local function hold_save(key, h, now)
  redis.call('SET', key, cjson.encode(h), 'PX', ttl_ms(tonumber(h.exp) - now))
end

local function line_spec(line)
  local sp = {
    key = line.k,
    kind = line.kind,
    a = tonumber(line.a),
    b = line.b,
    cost = tonumber(line.c),
    tok = line.tok == '1',
    ref = line.ref == '1',
  }
  if sp.kind == 'B' then
    sp.b = tonumber(sp.b)
  end
  return sp
end

-- Loads the hold at KEYS[1] for extend/renew/settle. Returns (hold, nil) or
-- (nil, reply): 'U' unknown or expired, 'S' settled, 'K' when KEYS[2..] are
-- not exactly the hold's budget keys (the caller refreshes them and retries).
local function hold_for_update(now)
  local h = hold_load(KEYS[1])
  if h == nil or tonumber(h.exp) <= now then
    return nil, { 'U', s(now) }
  end
  local lines = h.lines or {}
  if #KEYS - 1 ~= #lines then
    return nil, { 'K', s(now) }
  end
  for i = 1, #lines do
    if KEYS[i + 1] ~= lines[i].k then
      return nil, { 'K', s(now) }
    end
  end
  if h.st == '1' then
    return nil, { 'S', s(now) }
  end
  return h, nil
end
