-- budgetgate reserve: all-or-nothing debit of every budget one request touches.
-- Mirrors MemoryStore::reserve_sync (src/reserve/memory.rs); lib.lua is prepended.
--
-- KEYS[1]        the hold of this reservation id
-- KEYS[2..N+1]   one budget key per spec: the common specs, then every
--                candidate's specs, in order (all share one hash tag)
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2]        reservation id
-- ARGV[3]        tokens reserved (input + output estimate), tokens
-- ARGV[4]        concurrency lease, µs
-- ARGV[5]        hold lifetime, µs
-- ARGV[6]        number of common specs
-- ARGV[7]        number of candidates C
-- ARGV[8..7+C]   number of specs of each candidate
-- then 8 fields per spec, each a decimal string where a number:
--   kind   'B' bucket (a = per_minute tokens/min, b = burst tokens),
--          'Q' quota (a = limit per window, b = 'D' | 'M'),
--          'C' concurrency (a = max slots, b unused)
--   a, b   as above
--   cost   this request's debit in the budget's unit (tokens or requests)
--   tok    '1' when the budget counts tokens (extend and settle adjust it)
--   ref    '1' when unused tokens are refunded at settle
--   meta   opaque to Lua (scope and budget name for the Rust side)
--   sh     '1' for a shadow budget: debited when it admits, a refusal is
--          only reported, never enforced
--
-- Reply (every element a string):
--   {'A', now, candidate (0-based), '0', W, wd_1..wd_W, rem_1, reset_1, ...}
--       admitted; W shadow specs would have refused (their 0-based spec
--       indexes; not debited), then one (remaining, reset µs) pair per
--       debited bucket/quota of the common specs and the chosen candidate.
--   {'A', now, candidate, '1', hold}
--       replayed: the first admission's `now` and candidate, and the stored
--       hold (layout in lib.lua), whose adm section describes each budget
--       itself (the retry may not carry the same budgets); nothing written.
--   {'D', now, spec index (0-based), available, retry_after µs, reset µs}
--       denied; nothing was written.
--   {'I', now, spec index (0-based)}
--       impossible (cost above capacity); nothing was written.
--
-- Reads every string key once (MGET) and each slot set with ZCOUNT (and
-- ZSCORE when full). Phase 2 (only when all admit) writes:
--   buckets  SET PX until full again + margin
--   quotas   SET PX until the window ends + margin
--   slots    ZREMRANGEBYSCORE expired leases, ZADD id lease_end, PEXPIRE
--            (GT when the set already existed) until the new lease ends +
--            margin, so the set lives until its longest lease ends + margin
--   hold     SET PX until the hold expires + margin

local now = clock(ARGV[1])
local id = ARGV[2]
local tokens = num(ARGV[3], 'tokens')
local lease = num(ARGV[4], 'lease')
local hold_ttl = num(ARGV[5], 'hold_ttl')
local ncommon = num(ARGV[6], 'ncommon')
local ncand = num(ARGV[7], 'ncand')

local raw = load_all()

-- A live hold means this id was admitted: replay the first admission.
local prior = raw[KEYS[1]]
if prior then
  local _, exp = hold_head(prior)
  if exp > now then
    local pnow, pcand = match(prior, '^%d %d+ %d+ %d+ (%d+) (%d+)')
    return { 'A', pnow, pcand, '1', prior }
  end
end

local p = 8
local ranges = {}
local first = ncommon + 1
for c = 1, ncand do
  local n = num(ARGV[p], 'candidate size')
  ranges[c] = { first, first + n - 1 }
  first = first + n
  p = p + 1
end
-- spec: { p = first ARGV field, key, kind, a, b (burst for buckets), cost, sh }
local specs = {}
for i = 1, first - 1 do
  local kind = ARGV[p]
  local b = ARGV[p + 2]
  if kind == 'B' then
    b = num(b, 'burst')
  end
  specs[i] = { p = p, key = KEYS[i + 1], kind = kind, a = num(ARGV[p + 1], 'a'), b = b,
    cost = num(ARGV[p + 3], 'cost'), sh = ARGV[p + 7] == '1' }
  p = p + 8
end

-- Live leases per slot set (ZCOUNT), until this call writes the set.
local live = {}
local function live_slots(key)
  local n = live[key]
  if n == nil then
    n = call('ZCOUNT', key, '(' .. s(now), '+inf')
    live[key] = n
  end
  return n
end

-- Whole units available now (floor; negative in debt); for buckets also
-- the level in units.
local function available(sp)
  if sp.kind == 'B' then
    local level = bucket_at(raw[sp.key], sp.b, now, sp.key)
    return fdiv(level, UNITS), level
  elseif sp.kind == 'Q' then
    return sp.a - quota_used(raw[sp.key], (window(sp.b, now)), sp.key)
  end
  return sp.a - live_slots(sp.key)
end

-- nil when the spec admits, else {'I', i} or {'D', i, available, retry, reset}
-- (retry: exact ceiling for buckets, the window end for quotas, 0 for
-- concurrency: the caller applies its hint).
local function check(i)
  local sp = specs[i]
  local kind = sp.kind
  if kind == 'B' then
    if sp.cost > sp.b then
      return { 'I', i }
    end
    local avail, level = available(sp)
    if avail >= sp.cost then
      return nil
    end
    return { 'D', i, avail, refill_wait(sp.cost * UNITS - level, sp.a),
      refill_wait(sp.b * UNITS - level, sp.a) }
  elseif kind == 'Q' then
    if sp.cost > sp.a then
      return { 'I', i }
    end
    local avail = available(sp)
    if avail >= sp.cost then
      return nil
    end
    local _, wend = window(sp.b, now)
    return { 'D', i, avail, wend - now, wend - now }
  end
  local avail = available(sp)
  if avail >= 1 then
    return nil
  end
  local l = call('ZSCORE', sp.key, id)
  if l and tonumber(l) > now then
    return nil
  end
  return { 'D', i, avail, 0, 0 }
end

-- Every spec in [lo, hi] must admit: an impossible one wins at once, else
-- the denial with the longest wait (the first of equals).
local function check_all(lo, hi)
  local worst = nil
  for i = lo, hi do
    -- A shadow budget never blocks; it is evaluated again at admission.
    local r = nil
    if not specs[i].sh then
      r = check(i)
    end
    if r ~= nil then
      if r[1] == 'I' then
        return r
      end
      if worst == nil or r[4] > worst[4] then
        worst = r
      end
    end
  end
  return worst
end

local function reply(r)
  if r[1] == 'I' then
    return { 'I', s(now), s(r[2] - 1) }
  end
  return { 'D', s(now), s(r[2] - 1), s(r[3]), s(r[4]), s(r[5]) }
end

local snow = s(now)

-- Debits spec i; appends its hold key, live entry and adm fields, and the
-- (remaining, reset) pair of buckets and quotas to `out`.
local function admit_one(i, n, keys, lines, adm, out)
  local sp = specs[i]
  local key, kind, q = sp.key, sp.kind, sp.p
  local rem, reset = '', ''
  if kind == 'B' then
    local level, last = bucket_at(raw[key], sp.b, now, key)
    level = level - sp.cost * UNITS
    local floor_units = -(sp.b * UNITS)
    if level < floor_units then
      level = floor_units
    end
    local v = bucket_value(level, last, sp.a, sp.b)
    local until_full = refill_wait(sp.b * UNITS - level, sp.a)
    call('SET', key, v, 'PX', ttl_ms(until_full))
    raw[key] = v
    rem, reset = s(fdiv(level, UNITS)), s(until_full)
    if ARGV[q + 4] == '1' then
      lines[#lines + 1] = n .. ' B ' .. ARGV[q + 5] .. ' ' .. ARGV[q + 1] .. ' ' .. ARGV[q + 2] .. ' ;'
    end
  elseif kind == 'Q' then
    local w, wend = window(sp.b, now)
    local used = quota_used(raw[key], w, key) + sp.cost
    local v = s(w) .. ' ' .. s(used)
    call('SET', key, v, 'PX', ttl_ms(wend - now))
    raw[key] = v
    rem, reset = s(sp.a - used), s(wend - now)
    if ARGV[q + 4] == '1' then
      lines[#lines + 1] = n .. ' Q ' .. ARGV[q + 5] .. ' ' .. ARGV[q + 1] .. ' ' .. ARGV[q + 2]
        .. ' ' .. s(w) .. ':' .. ARGV[q + 3] .. ';'
    end
  else
    local existed = live_slots(key) > 0
    call('ZREMRANGEBYSCORE', key, '-inf', snow)
    call('ZADD', key, s(now + lease), id)
    -- A set that existed has a TTL reaching past its longest lease; a new one has none.
    if existed then
      call('PEXPIRE', key, ttl_ms(lease), 'GT')
    else
      call('PEXPIRE', key, ttl_ms(lease))
    end
    live[key] = nil
    lines[#lines + 1] = n .. ' C 0 ' .. ARGV[q + 1] .. ' 0 ;'
  end
  if kind ~= 'C' then
    out[#out + 1] = rem
    out[#out + 1] = reset
  end
  keys[n] = key
  local a = #adm
  adm[a + 1] = kind
  adm[a + 2] = ARGV[q + 1]
  adm[a + 3] = ARGV[q + 2]
  adm[a + 4] = ARGV[q + 3]
  adm[a + 5] = ARGV[q + 5]
  adm[a + 6] = ARGV[q + 6]
  adm[a + 7] = rem
  adm[a + 8] = reset
end

local function admit(candidate, lo, hi)
  local order = {}
  for i = 1, ncommon do
    order[#order + 1] = i
  end
  for i = lo, hi do
    order[#order + 1] = i
  end
  local keys, lines, adm, wd, wd_meta, vals = {}, {}, {}, {}, {}, {}
  for _, i in ipairs(order) do
    local sp = specs[i]
    if sp.sh and check(i) ~= nil then
      wd[#wd + 1] = s(i - 1)
      wd_meta[#wd_meta + 1] = ARGV[sp.p + 6]
    else
      admit_one(i, #keys + 1, keys, lines, adm, vals)
    end
  end
  local exp = now + hold_ttl
  local head = fmt('0 %d %d %d %d %d 0 0 0', exp, tokens, lease, now, candidate)
  local admsec = #wd_meta .. '\t' .. table.concat(wd_meta, '\t')
  if #wd_meta == 0 then
    admsec = '0'
  end
  if #adm > 0 then
    admsec = admsec .. '\t' .. table.concat(adm, '\t')
  end
  hold_save(head .. '\n' .. table.concat(keys, ' ') .. '\n' .. table.concat(lines) .. '\n\n'
    .. admsec .. '\n' .. id, exp, now)
  local out = { 'A', snow, s(candidate), '0', s(#wd) }
  for _, v in ipairs(wd) do
    out[#out + 1] = v
  end
  for _, v in ipairs(vals) do
    out[#out + 1] = v
  end
  return out
end


local common = check_all(1, ncommon)
if common ~= nil then
  return reply(common)
end

local best_denial, first_impossible = nil, nil
for c = 1, ncand do
  local r = check_all(ranges[c][1], ranges[c][2])
  if r == nil then
    return admit(c - 1, ranges[c][1], ranges[c][2])
  end
  if r[1] == 'D' then
    if best_denial == nil or r[4] < best_denial[4] then
      best_denial = r
    end
  elseif first_impossible == nil then
    first_impossible = r
  end
end
if best_denial ~= nil then
  return reply(best_denial)
end
if first_impossible ~= nil then
  return reply(first_impossible)
end
-- No candidates at all: admit on the common budgets alone.
return admit(0, 1, 0)
