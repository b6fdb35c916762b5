-- budgetgate reserve: all-or-nothing debit of every budget one request touches.
-- Mirrors MemoryStore::reserve_sync (src/budget/memory/). Defines
-- reserve(KEYS, ARGV), one item of a batch (batch.lua); lib.lua is prepended.
-- KEYS and ARGV below are the item's own.
--
-- KEYS[1]        the hold of this reservation id
-- KEYS[2..N+1]   one budget key per spec: the common specs, then every
--                candidate's specs, in order (all share one hash tag)
-- KEYS[N+2..]    the previous key layout's counter of each quota spec, in
--                spec order (read when the current counter is absent)
-- then           the share key (share.lua) of each candidate the share
--                claim lists, in its order (none without a claim)
-- then           with a run (ARGV[11+C+2N]): the run's record, its tenant's
--                run index (sorted set: run id → tokens reserved) and
--                that index's expiries (run id → record expiry µs), then
--                its key's runs-per-day counter when that is bounded
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2]        reservation id
-- ARGV[3]        tokens reserved (input + output estimate), tokens
-- ARGV[4]        concurrency lease, µs
-- ARGV[5]        hold lifetime, µs
-- ARGV[6]        number of common specs
-- ARGV[7]        number of candidates C
-- ARGV[8..7+C]   number of specs of each candidate
-- ARGV[8+C]      the numbers of the N specs, 5 per spec, each an exact
--                integer as a little-endian IEEE double (struct.pack('<d'),
--                8 bytes): one string read with one struct.unpack, instead of
--                5 decimal strings each converted with tonumber
--   kind   1 bucket (a = per_minute tokens/min, b = burst tokens),
--          2 quota (a = limit per window, b = 0 day | 1 month | 2 rolling
--            5 h | 3 rolling 24 h | 4 rolling week: lib.lua's WL),
--          3 concurrency (a = max slots, b = 0)
--   a, b   as above
--   cost   this request's debit in the budget's unit (tokens, requests,
--          µ$); for a common spec, the first candidate's (see below)
--   sh     1 for a shadow budget: debited when it admits, a refusal is
--          only reported, never enforced (else 0)
-- then 2 strings per spec, the hold text the Rust side renders once:
--   line   the spec's live entry without its line index and position
--          (layout in lib.lua): ' B <ref> <a> <b> ' (the script appends
--          '<cost>;'), ' C 0 <a> 0 ;', ' b <ref> <a> <b> ' (a request
--          bucket; the script appends '<cost>;'), or for a quota ' Q <ref> <a> <b> ' / ' q <ref> <a> <b> '
--          (a request quota; the script appends '<window>:<cost>;')
--   adm    the first six adm fields of the spec, tab-separated:
--          '<kind>\t<a>\t<b>\t<cost>\t<ref>\t<meta>' (meta is opaque to Lua:
--          scope and budget name for the Rust side)
-- ARGV[9+C+2N]   '' when every candidate costs the common specs alike, else
--                the cost of each common spec for each candidate (candidate
--                by candidate, C × ncommon packed doubles): a common budget
--                priced per deployment (dollars)
-- ARGV[10+C+2N]  '' without a share claim, else its words: tenant, class
--                rank, step (lead units, src/budget/share.rs), its order
--                (waiter id, 0: none; waited µs; left µs), then the
--                1-based numbers of the candidates whose share key follows
-- ARGV[11+C+2N]  '' without a run, else '<ttl µs> <runs per day, 0: not
--                bounded> <limits> <run id>': the run's record ('<expiry µs>
--                <limits>') is set to <limits> when absent or expired (a
--                start, counted on the runs-per-day counter,
--                a calendar-day quota) and compared otherwise, before any
--                budget is checked; only an admission writes it (src/budget
--                RunRecord) and adds ARGV[3] to the run in the index
--
-- Reply (every element a string; sent as one string of space-separated
-- words, lib.lua's words, except the replay, whose hold has spaces):
--   {'A', now, candidate (0-based), '0', W, wd_1..wd_W, rem_1, reset_1, ...}
--       admitted; W shadow specs would have refused (their 0-based spec
--       indexes; not debited), then one (remaining, reset µs) pair per
--       debited bucket/quota of the common specs and the chosen candidate.
--   {'A', now, candidate, '1', hold}
--       replayed: the first admission's `now` and candidate, and the stored
--       hold (layout in lib.lua), whose adm section describes each budget
--       itself (the retry may not carry the same budgets); nothing written.
--   {'D', now, spec index (0-based), available, retry_after µs, reset µs}
--       denied; nothing was debited (buckets whose stored policy differs
--       from the request's are brought under it: adopt_policies).
--   {'S', now, spec index, available, retry_after µs, reset µs}
--       denied as 'D', held back for share: the budgets would admit it,
--       the deployment's capacity goes to a tenant behind it (share.lua).
--       A refused claim is recorded in the share state of each candidate
--       that refused it by its own budgets or held it back.
--   {'V', now}
--       this id was voided (settle.lua, mode void) before or after it was
--       reserved: nothing written, never admitted.
--   {'I', now, spec index (0-based)}
--       impossible (cost above capacity); nothing was debited (as above).
--   {'R', now}
--       the run's record holds other limits: nothing was checked or written.
--   {'N', now, available, retry_after µs, reset µs}
--       the run would start beyond its key's runs per day: nothing written.
--
-- Building the hold costs the script string concatenations only: every
-- static part comes rendered in ARGV. (Measured with callgrind on
-- redis-server: building the adm fields and live entries from eight ARGV
-- fields per spec cost ~95k of a ~770k-instruction reservation alone, and
-- the numbers' tonumber calls and ARGV strings ~50k more; see
-- `PROFILE=redis scripts/instructions.sh`.)
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

-- Line indexes and spec positions as strings, so building the hold formats no number.
local LINE_INDEX = { '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12', '13', '14', '15', '16' }
LINE_INDEX[0] = '0'

-- nil when spec i (numbers at V[o + 1 .. o + 5], o = 5(i − 1)) admits, else
-- {'I', i} or {'D', i, available, retry, reset}: available whole units
-- (floor; negative in debt), retry µs (exact ceiling for buckets, the window
-- end for quotas, 0 for concurrency: the caller applies its hint), reset µs.
local function reserve_check(V, i, cost, key, now, snow, id, LEGACY)
  local o = 5 * i - 5
  local kind, a, b = V[o + 1], V[o + 2], V[o + 3]
  if kind == 1 then
    if cost > b then
      return { 'I', i }
    end
    local level, last = bucket_at(raw[key], b, now)
    local avail = fdiv(level, UNITS)
    if avail >= cost then
      return nil
    end
    return { 'D', i, avail, refill_wait(cost * UNITS - level, a, now, last),
      refill_wait(b * UNITS - level, a, now, last) }
  elseif kind == 2 then
    if cost > a then
      return { 'I', i }
    end
    local wl = WL[b]
    if ROLL[wl] ~= nil then
      local total, e = roll_at(raw[key], wl, now)
      local avail = a - total
      if avail >= cost then
        return nil
      end
      -- Refused: the reset is when enough will have slid out for it
      -- (Inner::refused_state), as the retry.
      local wait = roll_wait(e, wl, now, cost - avail)
      return { 'D', i, avail, wait, wait }
    end
    local lv = LEGACY[i] and raw[LEGACY[i]]
    local w, wend = window(wl, now, raw[key] or lv)
    local avail = a - quota_used_at(raw[key], lv, w)
    if avail >= cost then
      return nil
    end
    return { 'D', i, avail, wend - now, wend - now }
  end
  -- Fewer members than slots: some slot is free whatever the leases say.
  if slots_card(key) < a then
    return nil
  end
  local avail = a - call('ZCOUNT', key, '(' .. snow, '+inf')
  if avail >= 1 then
    return nil
  end
  local l = call('ZSCORE', key, id)
  if l and tonumber(l) > now then
    return nil
  end
  return { 'D', i, avail, 0, 0 }
end

-- Spec i's cost when candidate c (1-based) is chosen: a common spec's from
-- CC when common costs differ per candidate.
local function cost_of(V, CC, ncommon, i, c)
  if CC ~= nil and i <= ncommon then
    return CC[(c - 1) * ncommon + i]
  end
  return V[5 * i - 1]
end

-- Every spec in [lo, hi] must admit, costed for candidate c: an impossible
-- one wins at once, else the denial with the longest wait (the first of
-- equals, after `worst`, a result of earlier specs). A shadow budget never
-- blocks; it is evaluated again at admission.
local function reserve_check_all(V, CC, ncommon, c, KEYS, lo, hi, now, snow, id, LEGACY, worst)
  for i = lo, hi do
    if V[5 * i] ~= 1 then
      local r = reserve_check(V, i, cost_of(V, CC, ncommon, i, c), KEYS[i + 1], now, snow, id, LEGACY)
      if r ~= nil then
        if r[1] == 'I' then
          return r
        end
        if worst == nil or r[4] > worst[4] then
          worst = r
        end
      end
    end
  end
  return worst
end

-- A refusal still brings every bucket of the request under the request's
-- policy when the stored limit or burst differ (a reload changed them):
-- refilled up to now at the stored rate, at the new rate from now on, so
-- the retry hints (computed at the new rate) are what happens next. Written
-- once per bucket per policy change (MemoryStore's adopt_policies). Runs
-- after every ARGV number was checked: an item that raises wrote nothing.
local function adopt_policies(V, KEYS, nspec, now)
  for i = 1, nspec do
    local o = 5 * i - 5
    if V[o + 1] == 1 then
      local key = KEYS[i + 1]
      local v = raw[key]
      if v then
        local a, b = V[o + 2], V[o + 3]
        local _, _, rate, sburst = unpack_('<dddd', v)
        if rate ~= a or sburst ~= b then
          local level, last = bucket_at(v, b, now)
          put(key, pack('<dddd', level, last, a, b), ttl_ms(refill_wait(b * UNITS - level, a, now, last)))
        end
      end
    end
  end
end

-- An admission of run `id` of `tokens` in its tenant's index (`by_spend`,
-- `by_expiry`; src/budget/memory index_run): runs whose record has expired
-- leave (a run started again counts from 0), the run gains `tokens` and its
-- record's expiry `exp`, and beyond RUN_INDEX_MAX runs the least leave.
-- Only run admissions pay these calls.
local function run_indexed(by_spend, by_expiry, id, tokens, exp, ttl, snow)
  local gone = call('ZRANGEBYSCORE', by_expiry, '-inf', snow)
  if #gone > 0 then
    call('ZREM', by_spend, unpack(gone))
    call('ZREM', by_expiry, unpack(gone))
  end
  call('ZINCRBY', by_spend, tokens, id)
  call('ZADD', by_expiry, s(exp), id)
  local over = call('ZRANGE', by_spend, 0, -(RUN_INDEX_MAX + 1))
  if #over > 0 then
    call('ZREM', by_spend, unpack(over))
    call('ZREM', by_expiry, unpack(over))
  end
  call('PEXPIRE', by_spend, s(ttl))
  call('PEXPIRE', by_expiry, s(ttl))
end

local function reserve(KEYS, ARGV)
  local now = clock(ARGV[1])
  local id = ARGV[2]
  local ncommon = num(ARGV[6], 'ncommon')
  local ncand = num(ARGV[7], 'ncand')
  local tokens = num(ARGV[3], 'tokens')
  local lease_n = num(ARGV[4], 'lease')
  local hold_ttl = num(ARGV[5], 'hold_ttl')

  load(KEYS)

  -- A live hold means this id was admitted: replay the first admission.
  local prior = raw[KEYS[1]]
  if prior then
    local st, exp, pnow, pcand = match(prior, '^(%d) (%d+) %d+ %d+ (%d+) (%d+)')
    if tonumber(exp) > now then
      if st == '2' then
        -- Voided (a compensation got here first, or after): write nothing.
        return { 'V', s(now) }
      end
      -- The hold text has spaces and newlines: it stays an array reply.
      return { 'A', pnow, pcand, '1', prior, array = true }
    end
  end

  -- Candidate c's specs are LO[c] .. HI[c].
  local LO, HI = {}, {}
  local first = ncommon + 1
  for c = 1, ncand do
    local n = num(ARGV[7 + c], 'candidate size')
    LO[c], HI[c] = first, first + n - 1
    first = first + n
  end
  local nspec = first - 1
  -- ARGV index of the numbers; spec i's line is at T + 2i − 1, its adm at T + 2i.
  local T = 8 + ncand
  local V = { unpack_('<' .. string.rep('d', 5 * nspec), ARGV[T]) }
  local CC = nil
  local ccs = ARGV[T + 2 * nspec + 1]
  if ccs ~= nil and ccs ~= '' then
    CC = { unpack_('<' .. string.rep('d', ncand * ncommon), ccs) }
  end
  local snow = s(now)
  -- Spec i's previous-layout quota key, for quota specs.
  local LEGACY, q = {}, nspec + 1
  for i = 1, nspec do
    if V[5 * i - 4] == 2 then
      q = q + 1
      LEGACY[i] = KEYS[q]
    end
  end

  -- The share claim: SH[c] is candidate c's share key (nil: no claim).
  -- Parsed only when some share state exists, or when a refusal records
  -- one (before any write): an uncontended call reads its keys and no more.
  local share_arg = ARGV[T + 2 * nspec + 2]
  local SH, claim_t, claim_r, claim_step, claim_o = nil, nil, nil, nil, nil

  -- The run: its record compared, or (absent) its start counted.
  local run_key, run_limits, run_ttl, starts_key, starts_cap = nil, nil, nil, nil, nil
  local run_id, run_index, run_expiry = nil, nil, nil
  local nshare_end = #KEYS
  local run_arg = ARGV[T + 2 * nspec + 3]
  if run_arg ~= nil and run_arg ~= '' then
    local ttl, cap, limits, rid = match(run_arg, '^(%d+) (%d+) (%S+) (%S+)$')
    if rid == nil then
      error('bad run argument')
    end
    run_ttl, starts_cap, run_limits, run_id = tonumber(ttl), tonumber(cap), limits, rid
    local first = #KEYS - 2
    if starts_cap > 0 then
      first = #KEYS - 3
      starts_key = KEYS[#KEYS]
    end
    run_key, run_index, run_expiry = KEYS[first], KEYS[first + 1], KEYS[first + 2]
    nshare_end = first - 1
    -- The record is '<expiry µs> <limits>': its expiry is read against
    -- `now`, never left to the key's TTL alone (as holds keep theirs).
    local live = false
    local held = raw[run_key]
    if held then
      local exp, limits = match(held, '^(%d+) (%S+)$')
      if exp ~= nil and tonumber(exp) > now then
        if limits ~= run_limits then
          return { 'R', s(now) }
        end
        live = true
        starts_key = nil
      end
    end
    if not live and starts_key ~= nil then
      local w, wend = window('D', now)
      local avail = starts_cap - quota_used_at(raw[starts_key], nil, w)
      if avail < 1 then
        return { 'N', s(now), s(avail), s(wend - now), s(wend - now) }
      end
    end
  end

  for j = q + 1, nshare_end do
    if raw[KEYS[j]] then
      SH, claim_t, claim_r, claim_step, claim_o = share_claim(share_arg, KEYS, q)
      break
    end
  end

  local function reply(r)
    if r[1] == 'I' then
      return { 'I', snow, s(r[2] - 1) }
    end
    return { r[1], snow, s(r[2] - 1), s(r[3]), s(r[4]), s(r[5]) }
  end

  -- nil, or the refusal of the claim held back for share on candidate c
  -- (whose budgets all admit it): share.lua's share_refusal.
  local function share_check(c)
    local E = share_read(raw[SH[c]], now)
    if #E == 0 or not share_holds_back(E, claim_t, claim_r, claim_o, now) then
      return nil
    end
    local pick = share_named(V, LO[c], HI[c])
    if pick == nil then
      return nil
    end
    local legacy = LEGACY[pick] and raw[LEGACY[pick]]
    return share_refusal(V, pick, cost_of(V, CC, ncommon, pick, c), raw[KEYS[pick + 1]],
      KEYS[pick + 1], legacy, now, snow)
  end

  local function admit(candidate, lo, hi)
    local slot_score, slot_ttl = s(now + lease_n), ttl_ms(lease_n)
    local c = candidate + 1
    local scand = s(candidate)
    -- keys: the hold's budget keys; lines: its live entries; adm: its adm
    -- fields (static text, remaining, reset per line); wd, wd_meta:
    -- would-deny spec indexes and metas; out: the reply.
    local keys, lines, adm, wd, wd_meta = {}, {}, {}, {}, {}
    local out = { 'A', snow, scand, '0', '0' }
    local n = 0
    for pass = 1, 2 do
      local from, to = 1, ncommon
      if pass == 2 then
        from, to = lo, hi
      end
      for i = from, to do
        local o = 5 * i - 5
        local kind, a, b = V[o + 1], V[o + 2], V[o + 3]
        local cost = cost_of(V, CC, ncommon, i, c)
        -- The spec's position among the hold's specs (common, then the
        -- candidate's): what extend rates and settle actuals are indexed by.
        local p = i - 1
        if pass == 2 then
          p = ncommon + i - lo
        end
        local pos = ' ' .. (LINE_INDEX[p] or s(p))
        -- The amount as text: the request's tokens as sent (nothing to format)
        -- when it is that.
        local debit = ARGV[3]
        if cost ~= tokens then
          debit = s(cost)
        end
        if V[o + 5] == 1 and reserve_check(V, i, cost, KEYS[i + 1], now, snow, id, LEGACY) ~= nil then
          wd[#wd + 1] = s(i - 1)
          wd_meta[#wd_meta + 1] = match(ARGV[T + 2 * i], '([^\t]*)$')
        else
          local key, line = KEYS[i + 1], ARGV[T + 2 * i - 1]
          n = n + 1
          keys[n] = key
          local rem, reset = '', ''
          if kind == 1 then
            local level, last = bucket_at(raw[key], b, now)
            -- Admitted: cost ≤ what is available, so the floor is never reached.
            level = bucket_debit(level, cost * UNITS)
            local until_full = refill_wait(b * UNITS - level, a, now, last)
            put(key, pack('<dddd', level, last, a, b), ttl_ms(until_full))
            rem, reset = s(fdiv(level, UNITS)), s(until_full)
            lines[#lines + 1] = (LINE_INDEX[n] or s(n)) .. pos .. line .. debit .. ';'
          elseif kind == 2 and ROLL[WL[b]] ~= nil then
            local wl = WL[b]
            local total, e, sb = roll_at(raw[key], wl, now)
            total, e, sb = roll_debit(total, e, wl, now, cost)
            roll_put(key, total, e, wl, now)
            rem, reset = s(a - total), s(roll_until_empty(e, wl, now))
            lines[#lines + 1] = (LINE_INDEX[n] or s(n)) .. pos .. line .. s(sb) .. ':' .. debit .. ';'
          elseif kind == 2 then
            local lv = LEGACY[i] and raw[LEGACY[i]]
            local w, wend = window(WL[b], now, raw[key] or lv)
            local used = quota_used_at(raw[key], lv, w) + cost
            put(key, pack('<dd', w, used), ttl_ms(wend - now))
            rem, reset = s(a - used), s(wend - now)
            lines[#lines + 1] = (LINE_INDEX[n] or s(n)) .. pos .. line .. s(w) .. ':' .. debit .. ';'
          else
            slot_take(key, slot_score, id, slot_ttl, a, snow)
            lines[#lines + 1] = (LINE_INDEX[n] or s(n)) .. pos .. line
          end
          if kind ~= 3 then
            out[#out + 1] = rem
            out[#out + 1] = reset
          end
          local m = #adm
          local fields = ARGV[T + 2 * i]
          if CC ~= nil and i <= ncommon then
            -- Rendered with the first candidate's cost: put the chosen one's.
            fields = string.gsub(fields, '^([^\t]*\t[^\t]*\t[^\t]*\t)[^\t]*', '%1' .. s(cost), 1)
          end
          adm[m + 1] = fields
          adm[m + 2] = rem
          adm[m + 3] = reset
        end
      end
    end
    local admsec = '0'
    if #wd_meta > 0 then
      admsec = s(#wd_meta) .. '\t' .. table.concat(wd_meta, '\t')
    end
    if #adm > 0 then
      admsec = admsec .. '\t' .. table.concat(adm, '\t')
    end
    put(KEYS[1], '0 ' .. s(now + hold_ttl) .. ' ' .. ARGV[3] .. ' ' .. ARGV[4]
      .. ' ' .. snow .. ' ' .. scand .. ' 0 0 0\n' .. table.concat(keys, ' ') .. '\n'
      .. table.concat(lines) .. '\n\n' .. admsec .. '\n' .. id, ttl_ms(hold_ttl))
    if run_key ~= nil then
      put(run_key, s(now + run_ttl) .. ' ' .. run_limits, ttl_ms(run_ttl))
      if starts_key ~= nil then
        local w, wend = window('D', now)
        put(starts_key, pack('<dd', w, quota_used_at(raw[starts_key], nil, w) + 1), ttl_ms(wend - now))
      end
      run_indexed(run_index, run_expiry, run_id, ARGV[3], now + run_ttl, ttl_ms(run_ttl), snow)
    end
    if #wd > 0 then
      -- Insert the would-deny indexes before the (remaining, reset) pairs.
      local pairs_ = {}
      for j = 6, #out do
        pairs_[#pairs_ + 1] = out[j]
      end
      out = { 'A', snow, scand, '0', s(#wd) }
      for _, v in ipairs(wd) do
        out[#out + 1] = v
      end
      for _, v in ipairs(pairs_) do
        out[#out + 1] = v
      end
    end
    return out
  end

  -- Common costs alike for every candidate (the usual case): the common
  -- specs are checked once, and their refusal is the answer. Else,
  -- candidate by candidate, the first whose budgets admit together with
  -- the common ones (costed for it) is chosen.
  local common = nil
  if CC == nil then
    common = reserve_check_all(V, CC, ncommon, 1, KEYS, 1, ncommon, now, snow, id, LEGACY, nil)
    if common ~= nil then
      adopt_policies(V, KEYS, nspec, now)
      return reply(common)
    end
  end
  if ncand == 0 then
    -- No candidates at all: admit on the common budgets alone.
    return admit(0, 1, 0)
  end
  local best_denial, first_impossible = nil, nil
  -- The candidates whose own budgets refused the claim or held it back.
  local contended = {}
  for c = 1, ncand do
    local r = common
    if CC ~= nil then
      r = reserve_check_all(V, CC, ncommon, c, KEYS, 1, ncommon, now, snow, id, LEGACY, nil)
    end
    if r == nil or r[1] ~= 'I' then
      local own = reserve_check_all(V, CC, ncommon, c, KEYS, LO[c], HI[c], now, snow, id, LEGACY, nil)
      if own ~= nil and own[1] == 'D' then
        contended[#contended + 1] = c
      end
      if own == nil and r == nil and SH ~= nil and SH[c] ~= nil then
        own = share_check(c)
        if own ~= nil then
          contended[#contended + 1] = c
        end
      end
      -- The common budgets' refusal among equal waits; an impossible one wins.
      if own ~= nil and (r == nil or own[1] == 'I' or own[4] > r[4]) then
        r = own
      end
    end
    if r == nil then
      if SH ~= nil and SH[c] ~= nil then
        local E = share_read(raw[SH[c]], now)
        if #E > 0 then
          share_admitted(SH[c], E, claim_t, claim_r, claim_step, claim_o, now)
        end
      end
      return admit(c - 1, LO[c], HI[c])
    end
    if r[1] ~= 'I' then
      if best_denial == nil or r[4] < best_denial[4] then
        best_denial = r
      end
    elseif first_impossible == nil then
      first_impossible = r
    end
  end
  if best_denial ~= nil then
    if SH == nil and #contended > 0 then
      SH, claim_t, claim_r, claim_step, claim_o = share_claim(share_arg, KEYS, q)
    end
    adopt_policies(V, KEYS, nspec, now)
    if SH ~= nil then
      for _, c in ipairs(contended) do
        if SH[c] ~= nil then
          share_refused(SH[c], share_read(raw[SH[c]], now), claim_t, claim_r, claim_o, now)
        end
      end
    end
    return reply(best_denial)
  end
  adopt_policies(V, KEYS, nspec, now)
  return reply(first_impossible)
end
