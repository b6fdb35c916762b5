-- budgetgate: shared Lua library, prepended to every script at build time
-- (src/budget/redis/scripts.rs concatenates a prelude, lib.lua with extend.lua, renew.lua,
-- inspect.lua, lower.lua and lease.lua, and with reserve.lua + settle.lua + batch.lua;
-- each result is one EVALSHA script). State below (`raw`, deferred writes,
-- slot counts) lives for one script call, which may carry a whole batch.
--
-- It mirrors the Rust reference in src/budget/bucket.rs (token buckets),
-- src/budget/calendar.rs (UTC quota windows) and the decisions of
-- src/budget/memory/ (DESIGN section 2).
--
-- Numbers: Lua 5.1 numbers are doubles. Every value here is an integer below
-- 2^53 (bounds proved in src/budget/bucket.rs: levels within [-2^52, 6e14]
-- units, intermediate values below 5.2e15, times below 2e15 µs),
-- so additions, subtractions and products are exact; only division needs care,
-- see fdiv. Every number crosses the script boundary (ARGV, replies) as a
-- decimal integer string (s() to write, tonumber() to read), never as a Lua
-- number reply.
--
-- Cost (measured: each redis.call, tonumber, string.format or pattern match
-- costs thousands of CPU instructions, as much as a whole token-bucket
-- computation): this chunk runs on every call, so it defines few functions;
-- the scripts read every string key once per call (one MGET, then a per-call
-- cache of what they wrote since), convert each ARGV number once, reuse
-- ARGV strings instead of re-formatting them, and keep budget state binary.
--
-- Stored values (every key is written with a TTL):
--   bucket  struct.pack('<dddd', level units (1/60,000 token), last µs
--           (refilled up to; advances by whole ms), per_minute, burst):
--           32 bytes, four little-endian IEEE doubles, each an exact integer
--   quota   struct.pack('<dd', window id, used): 16 bytes (of a window
--           from first use, the id is the µs it started at)
--   rolling (a quota of a rolling window, src/budget/rolling.rs)
--           struct.pack('<d', total) then one struct.pack('<dd', sub-bucket
--           id, amount) per non-empty sub-bucket still counted, oldest
--           first: 8 + 16 × (at most n + 1) bytes
--   slots   sorted set: member = reservation id, score = lease end (UTC µs)
--   hold    text, 6 sections separated by "\n" (layout v2):
--     1 header  "<st> <exp> <res> <lease> <now> <cand> <snow> <refunded> <debt>"
--               st '0' live | '1' settled | '2' voided (a reserve of the id
--               answers 'V' and writes nothing); exp logical expiry µs; res tokens
--               reserved incl. extensions; lease µs; now admission µs; cand
--               chosen candidate (0-based); snow/refunded/debt the settle
--               (µs, tokens, tokens; '0' until settled)
--     2 keys    the budget keys of the hold's lines, in line order, joined by
--               ' ' (keys never contain whitespace); '' once settled
--     3 live    what extend/renew/settle need, one entry per budget:
--               "<i> <p> <kind> <ref> <a> <b> <d>;" with i the 1-based line
--               index (its key is KEYS[i + 1]), p the spec's 0-based
--               position among the reservation's specs (common, then the
--               chosen candidate's, shadow ones included: what extend rates
--               and settle actuals are indexed by), kind B/Q (amount
--               bucket/quota: tokens, µ$), C (concurrency), b/q (request
--               bucket/quota: refunded only by a void settle), d: a bucket's
--               amount reserved (initial + extensions; a request bucket's
--               cost), a quota's debits "w:amount,w:amount", '' for
--               concurrency; '' once settled
--     4 ext     extensions "now:granted now:granted" (µs, tokens)
--     5 adm     what a replayed reserve answers, tab-separated: W, the W
--               would-deny metas, then per line kind, a, b, cost, ref, meta,
--               remaining, reset µs (remaining/reset '' for concurrency)
--     6 id      the reservation id (last: it may contain anything)
--   A void of an id with no hold writes a void tombstone:
--   "2 <exp> 0 0 <now> 0 <now> 0 0\n\n\n\n0\n<id>".
--   Settle shrinks the hold to a tombstone: header (st '1', '2' for a void), empty keys and
--   live sections, ext, adm '0' (no budgets), id; it answers AlreadySettled
--   and replays (without budgets) until it expires.

-- Constants shared with Rust (UNITS units per token, DAY µs per UTC day,
-- ROLL the sub-bucket length µs and count of each rolling window by letter,
-- FIRST the length µs of each window from first use by letter,
-- MARGIN_MS added to every TTL, LAYOUT the key-layout version, DEBT_FLOOR
-- the lowest bucket level, MAX_WAIT_MS the longest wait computed, MAX_COST
-- the largest single amount) are defined
-- by a prelude that src/budget/redis/scripts.rs writes from the Rust
-- constants in front of every script: they are never copied by hand.

local call, fmt, match, find, sub, floor =
  redis.call, string.format, string.match, string.find, string.sub, math.floor
-- Binary budget state (see above): pack('<dddd', ...), unpack('<dddd', v);
-- a value of the wrong length raises an error.
local pack, unpack_ = struct.pack, struct.unpack

-- Floor of a / b for b > 0, exact for |a| < 2^53. math.floor(a / b) alone can
-- be off by one when a / b rounds to the next integer; the remainder corrects it.
local function fdiv(a, b)
  local q = floor(a / b)
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

-- Decimal integer string of an integral number below 2^53 ('%d' converts
-- through a 64-bit long: exact, and "-0" never appears).
local function s(x)
  return fmt('%d', x)
end

-- A reserve or settle reply as one string of space-separated words. The
-- gateway splits it itself: redis-rs parsed each element of an array reply
-- with its general RESP parser, ~1k instructions apiece, ~20 per request
-- (measured with callgrind). Numbers are written as the integers Redis would
-- have converted them to. A reply marked `array` (one whose strings hold
-- spaces) is returned as it is.
local function words(r)
  if r.array then
    return r
  end
  for j = 1, #r do
    if type(r[j]) == 'number' then
      r[j] = fmt('%d', r[j])
    end
  end
  return table.concat(r, ' ')
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
-- A batch reads TIME once: its items run in one atomic call, at one instant.
local time_now = nil
local function clock(arg)
  if arg ~= nil and arg ~= '' then
    return num(arg, 'now')
  end
  if time_now == nil then
    local t = call('TIME')
    time_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return time_now
end

-- TTL in ms (≥ 1 + margin) for a key that stops mattering `micros` from now.
-- (A Lua number passed to redis.call is written with 14 significant digits:
-- exact for any TTL here.)
local function ttl_ms(micros)
  if micros < 0 then
    micros = 0
  end
  return cdiv(micros, 1000) + MARGIN_MS
end

---------------------------------------------------------------- buckets

-- BucketState::advance of the stored value `v` (false when absent: full under
-- the new policy): refill at the stored rate up to the stored capacity, in
-- whole milliseconds (one ms at L/min adds L units), then adopt the new
-- burst (a lower burst clamps the level; a higher one grants nothing).
-- Returns level (units) and last (µs): `last` advances by the milliseconds
-- credited, so the sub-millisecond rest carries over (to `now` once full).
local function bucket_at(v, burst, now)
  local cap = burst * UNITS
  if not v then
    return cap, now
  end
  local level, last, rate, sburst = unpack_('<dddd', v)
  local t = last
  if now > t then
    t = now
  end
  local scap = sburst * UNITS
  if level >= scap then
    last = t
  else
    -- refill(level, last, t, stored rate, stored capacity)
    local elapsed = fdiv(t - last, 1000)
    local max_ms = cdiv(scap - level, rate)
    if elapsed >= max_ms then
      level, last = scap, t
    else
      level = level + elapsed * rate
      last = last + elapsed * 1000
    end
  end
  if level > cap then
    level = cap
  end
  return level, last
end

-- The stored value `v` brought to now under the policy it is stored with
-- (BucketState::advance at its own rate and burst; `v` false: full under
-- `per_minute` and `burst`). For counts taken under a policy that a reload
-- may have changed since (a settle, an extension, a lease's debt, give
-- back or end): they change the level, never the policy, so the next
-- reservation refills at the stored (new) rate. A bucket full by now
-- carries no state worth its policy (its key may have expired already):
-- it is brought under the given policy, as bucket_at does. Returns level,
-- last, rate, burst (Inner::stored_bucket).
local function bucket_stored(v, per_minute, burst, now)
  if not v then
    return burst * UNITS, now, per_minute, burst
  end
  local _, _, rate, sburst = unpack_('<dddd', v)
  local level, last = bucket_at(v, sburst, now)
  if level >= sburst * UNITS then
    level, last = bucket_at(v, burst, now)
    return level, last, per_minute, burst
  end
  return level, last, rate, sburst
end

-- µs from `now` until `need` more units have refilled at `per_minute` units
-- per ms, for a bucket refilled up to `last` (0 when none is needed): whole
-- milliseconds, capped at MAX_WAIT_MS before the conversion to µs; the part
-- of the current millisecond already elapsed counts (bucket::refill_wait).
local function refill_wait(need, per_minute, now, last)
  if need <= 0 then
    return 0
  end
  local ms = cdiv(need, per_minute)
  if ms > MAX_WAIT_MS then
    ms = MAX_WAIT_MS
  end
  local elapsed = now - last
  if elapsed < 0 then
    elapsed = 0
  end
  local w = ms * 1000 - elapsed
  if w < 1 then
    w = 1
  end
  return w
end

-- Takes `units` from `level`, never below DEBT_FLOOR: returns the new level
-- and the units that passed the floor (forgiven; BucketState::debit).
local function bucket_debit(level, units)
  local after = level - units
  if after < DEBT_FLOOR then
    return DEBT_FLOOR, DEBT_FLOOR - after
  end
  return after, 0
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

-- Window letters by the number reserve.lua's spec numbers carry
-- (wire::spec_numbers): day, month, the rolling 5 h, 24 h and week, then
-- the same lengths from first use.
local WL = { [0] = 'D', [1] = 'M', [2] = 'F', [3] = 'H', [4] = 'W', [5] = 'f', [6] = 'h', [7] = 'w' }

-- Window::id and Window::end of the window 'D' | 'M' containing now
-- (computed once per `now`: a call, or a batch without a test clock, has
-- one): days since the epoch or year × 12 + month − 1, and the exclusive
-- end, UTC µs; of a rolling window 'F' | 'H' | 'W', the sub-bucket of now
-- and its end. Of a window from first use 'f' | 'h' | 'w'
-- (Window::current), the one the stored value `v` (false or nil: none)
-- started, until it ends; else one starting now.
local windows, windows_now = {}, nil
local function window(w, now, v)
  local len = FIRST[w]
  if len ~= nil then
    if v then
      local start = unpack_('<d', v)
      if now < start + len then
        return start, start + len
      end
    end
    return now, now + len
  end
  if windows_now ~= now then
    windows, windows_now = {}, now
  end
  local c = windows[w]
  if c == nil then
    local day = fdiv(now, DAY)
    local r = ROLL[w]
    if r ~= nil then
      local sb = fdiv(now, r[1])
      c = { sb, (sb + 1) * r[1] }
    elseif w == 'D' then
      c = { day, (day + 1) * DAY }
    else
      local y, m = civil_from_days(day)
      local id = y * 12 + m - 1
      if m == 12 then
        y, m = y + 1, 1
      else
        m = m + 1
      end
      c = { id, days_from_civil(y, m, 1) * DAY }
    end
    windows[w] = c
  end
  return c[1], c[2]
end

-- Tokens (or requests) used in window `w` of the stored value `v` (false when
-- absent; 0 when the stored counter is of another window).
local function quota_used(v, w)
  if not v then
    return 0
  end
  local sw, used = unpack_('<dd', v)
  if sw == w then
    return used
  end
  return 0
end

-- Like quota_used, for a counter that may exist only under the previous key
-- layout: when the current value `v` is absent, the previous layout's
-- counter `legacy` (false or nil when there is none) counts, so a layout
-- bump keeps every quota (the first write copies it forward).
local function quota_used_at(v, legacy, w)
  if not v and legacy then
    return quota_used(legacy, w)
  end
  return quota_used(v, w)
end

---------------------------------------------------------------- rolling

-- Mirrors src/budget/rolling.rs (module docs: the shape, the proof). A
-- state is `total` and `e`, the packed '<dd' (sub-bucket, amount) pairs,
-- oldest first; stored as pack('<d', total) .. e.

-- The stored value `v` (false: none) of rolling window `w` ('F' | 'H' |
-- 'W') at `now`, with the sub-buckets that have left dropped
-- (Rolling::advance): total, entries.
local function roll_at(v, w, now)
  if not v then
    return 0, ''
  end
  local r = ROLL[w]
  local c = fdiv(now, r[1])
  local n = r[2]
  local total = unpack_('<d', v)
  local pos, len = 9, #v
  while pos < len do
    local b, a = unpack_('<dd', v, pos)
    if b + n >= c then
      break
    end
    total = total - a
    pos = pos + 16
  end
  return total, sub(v, pos)
end

-- Rolling::debit: `amount` to the sub-bucket of now, the total capped at
-- MAX_COUNT; returns total, entries, the sub-bucket id.
local function roll_debit(total, e, w, now, amount)
  local c = fdiv(now, ROLL[w][1])
  if amount > MAX_COUNT - total then
    amount = math.max(MAX_COUNT - total, 0)
  end
  total = total + amount
  local len = #e
  if len >= 16 then
    local b, a = unpack_('<dd', e, len - 15)
    if b == c then
      return total, sub(e, 1, len - 16) .. pack('<dd', b, a + amount), c
    end
  end
  return total, e .. pack('<dd', c, amount), c
end

-- Rolling::credit: up to `amount` back to sub-bucket `sb` (nothing when it
-- has left; never more than it holds); returns total, entries, what went
-- back.
local function roll_credit(total, e, sb, amount)
  local pos = #e - 15
  while pos >= 1 do
    local b, a = unpack_('<dd', e, pos)
    if b == sb then
      local r = math.min(amount, a)
      return total - r, sub(e, 1, pos - 1) .. pack('<dd', b, a - r) .. sub(e, pos + 16), r
    end
    if b < sb then
      break
    end
    pos = pos - 16
  end
  return total, e, 0
end

-- Rolling::refund: `amount` of a hold back to the sub-buckets of its
-- debits "w:amount,..." (in order), newest first, each at most its own
-- amount, none to a sub-bucket that has left.
local function roll_refund(total, e, w, now, d, amount)
  local r = ROLL[w]
  local c, n = fdiv(now, r[1]), r[2]
  local D = {}
  for dw, da in string.gmatch(d, '(%d+):(%d+)') do
    D[#D + 1] = { tonumber(dw), tonumber(da) }
  end
  local left = amount
  for j = #D, 1, -1 do
    if left == 0 then
      break
    end
    local b, a = D[j][1], D[j][2]
    if b + n >= c then
      local x = math.min(left, a)
      total, e = roll_credit(total, e, b, x)
      left = left - x
    end
  end
  return total, e
end

-- µs from now until every unit has left (Rolling::until_empty; 0 when empty).
local function roll_until_empty(e, w, now)
  local len = #e
  if len < 16 then
    return 0
  end
  local r = ROLL[w]
  local b = unpack_('<d', e, len - 15)
  return math.max((b + r[2] + 1) * r[1] - now, 0)
end

-- µs from now until `need` units have left (Rolling::wait_for).
local function roll_wait(e, w, now, need)
  if need <= 0 then
    return 0
  end
  local r = ROLL[w]
  local gone, pos, len = 0, 1, #e
  while pos < len do
    local b, a = unpack_('<dd', e, pos)
    gone = gone + a
    if gone >= need then
      return math.max((b + r[2] + 1) * r[1] - now, 0)
    end
    pos = pos + 16
  end
  return roll_until_empty(e, w, now)
end

---------------------------------------------------------------- holds

---------------------------------------------------------------- state

-- String values by key name: what Redis held when first read (false for
-- absent keys and for the slot sets, which MGET reports as nil), replaced by
-- every later write of the same call. A key is read at most once per call.
local raw = {}

-- Reads the keys of `keys` not read yet, in one MGET; returns `raw`. (A
-- key listed twice is read twice: cheaper than tracking which were listed.)
local function load(keys)
  local missing, n = {}, 0
  for i = 1, #keys do
    local k = keys[i]
    if raw[k] == nil then
      n = n + 1
      missing[n] = k
    end
  end
  if n > 0 then
    local vals = call('MGET', unpack(missing))
    for i = 1, n do
      raw[missing[i]] = vals[i]
    end
  end
  return raw
end

local function load_all()
  return load(KEYS)
end

-- String writes are deferred to flush(), once per key per call with the
-- last value and its TTL (ms): a batch that debits one bucket for many
-- reservations writes it once. Reads go through `raw`, so a deferred write
-- is seen by everything after it in the same call.
local dirty, dirty_order = {}, {}
local function put(key, v, ttl)
  if dirty[key] == nil then
    dirty_order[#dirty_order + 1] = key
  end
  dirty[key] = ttl
  raw[key] = v
end

-- The stored value of a rolling state, and its TTL (ms): until every
-- unit has left, plus the margin.
local function roll_put(key, total, e, w, now)
  put(key, pack('<d', total) .. e, ttl_ms(roll_until_empty(e, w, now)))
end

-- Slot sets are written at once (ZADD, ZREM: later checks count their
-- members), but their TTLs are deferred like string writes. expiring[key] =
-- { ttl ms, plain }: plain when the set was created in this call (PEXPIRE,
-- since GT never sets a TTL on a key without one), else PEXPIRE GT (a set
-- keeps the TTL of its longest lease).
local card, expiring, expiring_order = {}, {}, {}

-- Member count of a slot set (ZCARD once per call, then kept up to date
-- from what ZADD, ZREM and ZREMRANGEBYSCORE report).
local function slots_card(key)
  local n = card[key]
  if n == nil then
    n = call('ZCARD', key)
    card[key] = n
  end
  return n
end

-- Takes a slot until `score` (lease end, µs string) for `id`; `ttl` ms is
-- the lease's TTL. Drops expired leases first when the set is at `max`.
local function slot_take(key, score, id, ttl, max, snow)
  local c = slots_card(key)
  if c >= max then
    -- Near the limit: drop expired leases (the set existed before iff some
    -- lease is live, since Redis deletes an emptied set).
    c = c - call('ZREMRANGEBYSCORE', key, '-inf', snow)
  end
  card[key] = c + call('ZADD', key, score, id)
  local e = expiring[key]
  if e == nil then
    expiring_order[#expiring_order + 1] = key
  end
  if c == 0 or e == nil then
    expiring[key] = { ttl, c == 0 }
  elseif ttl > e[1] then
    e[1] = ttl
  end
end

-- Frees the slot of `id` (the set keeps its TTL; Redis deletes an empty set).
local function slot_free(key, id)
  local removed = call('ZREM', key, id)
  if card[key] ~= nil then
    card[key] = card[key] - removed
  end
end

-- Applies the deferred writes: SET PX per string key, PEXPIRE per slot set.
-- TTLs go to redis.call as s() strings: Redis formats a Lua number argument
-- with snprintf('%.17g'), which costs more than '%d' (measured).
local function flush()
  for i = 1, #dirty_order do
    local key = dirty_order[i]
    call('SET', key, raw[key], 'PX', s(dirty[key]))
  end
  for i = 1, #expiring_order do
    local key = expiring_order[i]
    local e = expiring[key]
    if e[2] then
      call('PEXPIRE', key, s(e[1]))
    else
      call('PEXPIRE', key, s(e[1]), 'GT')
    end
  end
  dirty, dirty_order, expiring, expiring_order = {}, {}, {}, {}
end

-- Loads the hold value `h` for extend/renew/settle. Returns the hold, or
-- (nil, reply): 'U' unknown or expired, 'S' settled, 'K' when KEYS[2..] are
-- not exactly the hold's budget keys (the caller refreshes them and retries).
-- Hold: { exp, res (numbers), res_s (res as stored), lease, head (header
-- fields 2–6 as stored: "<exp> <res> <lease> <now> <cand>"), live, ext,
-- raw (the whole value), rest_at (where its adm section starts) }.
local function hold_for_update(h, now, KEYS)
  if not h then
    return nil, { 'U', s(now) }
  end
  -- Sections by plain searches for '\n' (memchr) rather than one pattern
  -- with [^\n]* classes, which tests every byte of the ~400-byte keys
  -- section one class match at a time (measured: 18k fewer of a settle's
  -- ~360k instructions).
  local e1 = find(h, '\n', 1, true)
  local e2 = e1 and find(h, '\n', e1 + 1, true)
  local e3 = e2 and find(h, '\n', e2 + 1, true)
  local e4 = e3 and find(h, '\n', e3 + 1, true)
  local st, head, exp, res, lease
  if e4 then
    st, head, exp, res, lease = match(h, '^(%d) ((%d+) (%d+) (%d+) %d+ %d+) ')
  end
  if not st then
    error('budgetgate: bad hold at ' .. KEYS[1])
  end
  exp = tonumber(exp)
  if exp <= now then
    return nil, { 'U', s(now) }
  end
  if st ~= '0' then
    -- Settled ('1') or voided ('2').
    return nil, { 'S', s(now) }
  end
  if sub(h, e1 + 1, e2 - 1) ~= table.concat(KEYS, ' ', 2) then
    return nil, { 'K', s(now) }
  end
  return { exp = exp, res = tonumber(res), res_s = res, lease = lease, head = head,
    live = sub(h, e2 + 1, e3 - 1), ext = sub(h, e3 + 1, e4 - 1), raw = h, rest_at = e4 + 1 }, nil
end

-- Iterates the live section: i, p, kind, ref, a, b, d (strings; see above).
local function live_lines(live)
  return string.gmatch(live, '(%d+) (%d+) (%a) (%d) (%d+) (%w+) ([^;]*);')
end

-- The packed doubles of an optional per-spec ARGV ('' or absent: nil).
local function per_spec(arg)
  if arg == nil or arg == '' then
    return nil
  end
  return { unpack_('<' .. string.rep('d', #arg / 8), arg) }
end

-- Sum of the amounts of a quota line's debits "w:amount,..." in window w
-- (every window when w is nil).
local function debited(d, w)
  local sum = 0
  for dw, da in string.gmatch(d, '(%d+):(%d+)') do
    if w == nil or tonumber(dw) == w then
      sum = sum + tonumber(da)
    end
  end
  return sum
end

-- What a grant of g tokens debits at `rate` units per RATE_ONE tokens:
-- ceil(g × rate / RATE_ONE), exact below 2^53 (g = gh·RATE_ONE + gl: gh·rate
-- ≤ 10^4 · MAX_RATE, gl·rate < RATE_ONE · MAX_RATE = 10^15).
local function rate_debit(g, rate)
  if rate == RATE_ONE then
    return g
  end
  local gh = fdiv(g, RATE_ONE)
  local gl = g - gh * RATE_ONE
  return gh * rate + cdiv(gl * rate, RATE_ONE)
end

-- The largest grant ≤ want whose rate_debit fits `avail` whole units:
-- floor(avail × RATE_ONE / rate) without forming the product (q =
-- floor(avail / rate); when q·RATE_ONE ≥ want the whole step fits, else q <
-- 10^4 + 1 and the rest r < rate ≤ MAX_RATE keeps r·RATE_ONE < 10^15).
local function rate_grant(avail, rate, want)
  if avail <= 0 then
    return 0
  end
  if rate == RATE_ONE then
    return math.min(avail, want)
  end
  local q = fdiv(avail, rate)
  if q >= cdiv(want, RATE_ONE) then
    return want
  end
  return math.min(want, q * RATE_ONE + fdiv((avail - q * rate) * RATE_ONE, rate))
end
