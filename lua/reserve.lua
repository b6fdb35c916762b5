-- budgetgate reserve: all-or-nothing debit of every budget one request touches.
-- Mirrors MemoryStore::reserve_sync (src/reserve/memory.rs). Defines
-- reserve(KEYS, ARGV), one item of a batch (batch.lua); lib.lua is prepended.
-- KEYS and ARGV below are the item's own.
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
-- Phase 1 reads every string key once per batch (MGET) and each slot set
-- with ZCARD (ZCOUNT of live leases, and ZSCORE of this id, only when the
-- set holds `max` members or more). Phase 2 (only when all admit) writes:
--   buckets  SET PX until full again + margin (deferred: once per batch)
--   quotas   SET PX until the window ends + margin (deferred)
--   slots    ZREMRANGEBYSCORE of expired leases (only when the set held
--            `max` or more: the set stays near its limit in size), ZADD id
--            lease_end, PEXPIRE until the new lease ends + margin (with GT
--            when the set already existed: it keeps its longer TTL), so a set
--            lives until its longest lease ends + margin (PEXPIRE deferred)
--   hold     SET PX until the hold expires + margin (deferred)
-- Every ARGV number is checked before the first write, so an item that
-- raises an error has written nothing.

local function reserve(KEYS, ARGV)
  local now = clock(ARGV[1])
  local id = ARGV[2]
  local ncommon = num(ARGV[6], 'ncommon')
  local ncand = num(ARGV[7], 'ncand')
  num(ARGV[3], 'tokens')
  local lease_n = num(ARGV[4], 'lease')
  local hold_ttl = num(ARGV[5], 'hold_ttl')

  load(KEYS)

  -- A live hold means this id was admitted: replay the first admission.
  local prior = raw[KEYS[1]]
  if prior then
    local exp, pnow, pcand = match(prior, '^%d (%d+) %d+ %d+ (%d+) (%d+)')
    if tonumber(exp) > now then
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
  -- Specs as flat arrays (one table each, not one per spec): the first ARGV
  -- field, kind, a, b (a number for buckets), cost (a number but for slots).
  local P, KIND, A, B, COST = {}, {}, {}, {}, {}
  for i = 1, first - 1 do
    local kind = ARGV[p]
    P[i], KIND[i], A[i] = p, kind, num(ARGV[p + 1], 'a')
    if kind == 'B' then
      B[i], COST[i] = num(ARGV[p + 2], 'burst'), num(ARGV[p + 3], 'cost')
    elseif kind == 'Q' then
      B[i], COST[i] = ARGV[p + 2], num(ARGV[p + 3], 'cost')
    end
    p = p + 8
  end

  local snow = s(now)

  -- nil when spec i admits, else {'I', i} or {'D', i, available, retry, reset}:
  -- available whole units (floor; negative in debt), retry µs (exact ceiling
  -- for buckets, the window end for quotas, 0 for concurrency: the caller
  -- applies its hint), reset µs.
  local function check(i)
    local kind, key = KIND[i], KEYS[i + 1]
    if kind == 'B' then
      local burst, cost = B[i], COST[i]
      if cost > burst then
        return { 'I', i }
      end
      local level = bucket_at(raw[key], burst, now)
      local avail = fdiv(level, UNITS)
      if avail >= cost then
        return nil
      end
      return { 'D', i, avail, refill_wait(cost * UNITS - level, A[i]),
        refill_wait(burst * UNITS - level, A[i]) }
    elseif kind == 'Q' then
      local cost = COST[i]
      if cost > A[i] then
        return { 'I', i }
      end
      local w, wend = window(B[i], now)
      local avail = A[i] - quota_used(raw[key], w)
      if avail >= cost then
        return nil
      end
      return { 'D', i, avail, wend - now, wend - now }
    end
    -- Fewer members than slots: some slot is free whatever the leases say.
    if slots_card(key) < A[i] then
      return nil
    end
    local avail = A[i] - call('ZCOUNT', key, '(' .. snow, '+inf')
    if avail >= 1 then
      return nil
    end
    local l = call('ZSCORE', key, id)
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
      if ARGV[P[i] + 7] ~= '1' then
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
      return { 'I', snow, s(r[2] - 1) }
    end
    return { 'D', snow, s(r[2] - 1), s(r[3]), s(r[4]), s(r[5]) }
  end

  local function admit(candidate, lo, hi)
    -- ARGV numbers are stored as passed (decimal integer strings) once checked.
    local lease = ARGV[4]
    local order = {}
    for i = 1, ncommon do
      order[#order + 1] = i
    end
    for i = lo, hi do
      order[#order + 1] = i
    end
    local slot_score, slot_ttl = s(now + lease_n), ttl_ms(lease_n)
    -- keys: the hold's budget keys; lines: its live entries; adm: its adm
    -- fields; wd, wd_meta: would-deny spec indexes and metas; out: the reply.
    local keys, lines, adm, wd, wd_meta = {}, {}, {}, {}, {}
    local out = { 'A', snow, s(candidate), '0', '0' }
    for _, i in ipairs(order) do
      local q = P[i]
      if ARGV[q + 7] == '1' and check(i) ~= nil then
        wd[#wd + 1] = s(i - 1)
        wd_meta[#wd_meta + 1] = ARGV[q + 6]
      else
        local key, kind = KEYS[i + 1], KIND[i]
        local n = #keys + 1
        local rem, reset = '', ''
        if kind == 'B' then
          local burst, per_minute = B[i], A[i]
          local level, last = bucket_at(raw[key], burst, now)
          level = level - COST[i] * UNITS
          if level < -(burst * UNITS) then
            level = -(burst * UNITS)
          end
          local v = pack('<dddd', level, last, per_minute, burst)
          local until_full = refill_wait(burst * UNITS - level, per_minute)
          put(key, v, ttl_ms(until_full))
          rem, reset = s(fdiv(level, UNITS)), s(until_full)
          if ARGV[q + 4] == '1' then
            lines[#lines + 1] = n .. ' B ' .. ARGV[q + 5] .. ' ' .. ARGV[q + 1] .. ' ' .. ARGV[q + 2] .. ' ;'
          end
        elseif kind == 'Q' then
          local w, wend = window(B[i], now)
          local used = quota_used(raw[key], w) + COST[i]
          put(key, pack('<dd', w, used), ttl_ms(wend - now))
          rem, reset = s(A[i] - used), s(wend - now)
          if ARGV[q + 4] == '1' then
            lines[#lines + 1] = n .. ' Q ' .. ARGV[q + 5] .. ' ' .. ARGV[q + 1] .. ' ' .. ARGV[q + 2]
              .. ' ' .. w .. ':' .. ARGV[q + 3] .. ';'
          end
        else
          slot_take(key, slot_score, id, slot_ttl, A[i], snow)
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
    end
    local admsec = #wd_meta .. ''
    if #wd_meta > 0 then
      admsec = admsec .. '\t' .. table.concat(wd_meta, '\t')
    end
    if #adm > 0 then
      admsec = admsec .. '\t' .. table.concat(adm, '\t')
    end
    put(KEYS[1], '0 ' .. s(now + hold_ttl) .. ' ' .. ARGV[3] .. ' ' .. lease
      .. ' ' .. snow .. ' ' .. candidate .. ' 0 0 0\n' .. table.concat(keys, ' ') .. '\n'
      .. table.concat(lines) .. '\n\n' .. admsec .. '\n' .. id, ttl_ms(hold_ttl))
    if #wd > 0 then
      -- Insert the would-deny indexes before the (remaining, reset) pairs.
      local pairs_ = {}
      for j = 6, #out do
        pairs_[#pairs_ + 1] = out[j]
      end
      out = { 'A', snow, s(candidate), '0', s(#wd) }
      for _, v in ipairs(wd) do
        out[#out + 1] = v
      end
      for _, v in ipairs(pairs_) do
        out[#out + 1] = v
      end
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
end
