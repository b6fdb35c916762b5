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
-- then 8 fields per spec (see spec_from_argv): kind, a, b, cost, tok, ref, meta, sh
--
-- Reply (every element a string):
--   {'A', now, candidate (0-based), '0', W, wd_1..wd_W, rem_1, reset_1, ...}
--       admitted; W shadow specs would have refused (their 0-based spec
--       indexes; not debited), then one (remaining, reset µs) pair per
--       debited bucket/quota of the common specs and the chosen candidate.
--   {'A', now, candidate, '1', W, meta_1..meta_W, rem_1, reset_1, kind_1, a_1, b_1, meta_1, ...}
--       replayed: the first admission's `now`, would-deny budgets (metas) and
--       values, each with its budget (the retry may not carry the same
--       budgets); nothing written.
--   {'D', now, spec index (0-based), available, retry_after µs, reset µs}
--       denied; nothing was written.
--   {'I', now, spec index (0-based)}
--       impossible (cost above capacity); nothing was written.
--
-- Phase 1 reads every budget; phase 2 (only when all admit) writes:
--   buckets  SET PX until full again + margin
--   quotas   SET PX until the window ends + margin
--   slots    ZADD id lease_end, PEXPIRE until the longest lease ends + margin
--   hold     SET PX until the hold expires + margin

local now = clock(ARGV[1])
local id = ARGV[2]
local tokens = num(ARGV[3], 'tokens')
local lease = num(ARGV[4], 'lease')
local hold_ttl = num(ARGV[5], 'hold_ttl')
local ncommon = num(ARGV[6], 'ncommon')
local ncand = num(ARGV[7], 'ncand')

local p = 8
local ranges = {}
local first = ncommon + 1
for c = 1, ncand do
  local n = num(ARGV[p], 'candidate size')
  ranges[c] = { first, first + n - 1 }
  first = first + n
  p = p + 1
end
local specs = {}
for i = 1, first - 1 do
  specs[i] = spec_from_argv(KEYS[i + 1], ARGV, p)
  p = p + 8
end

-- A live hold means this id was admitted: replay the first admission.
local prior = hold_load(KEYS[1])
-- The replay describes each budget itself (kind, a, b, meta), since a retry
-- need not carry the same budgets as the first request.
if prior ~= nil and tonumber(prior.exp) > now then
  local out = { 'A', prior.now, prior.cand, '1', tostring(#(prior.wd or {})) }
  for _, m in ipairs(prior.wd or {}) do
    out[#out + 1] = m
  end
  local adm = prior.adm or {}
  local j = 1
  for _, line in ipairs(prior.lines or {}) do
    if line.kind ~= 'C' then
      out[#out + 1] = adm[j]
      out[#out + 1] = adm[j + 1]
      out[#out + 1] = line.kind
      out[#out + 1] = line.a
      out[#out + 1] = line.b
      out[#out + 1] = line.m
      j = j + 2
    end
  end
  return out
end

-- nil when the spec admits, else {'I', i} or {'D', i, available, retry, reset}.
local function check(i)
  local sp = specs[i]
  if sp.kind ~= 'C' and sp.cost > capacity(sp) then
    return { 'I', i }
  end
  local avail = available(sp, now)
  local fits
  if sp.kind == 'C' then
    local l = lease_of(sp.key, id)
    fits = avail >= 1 or (l ~= nil and l > now)
  else
    fits = avail >= sp.cost
  end
  if fits then
    return nil
  end
  local _, reset = state_of(sp, now)
  return { 'D', i, avail, wait_for(sp, sp.cost, now), reset }
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

-- Debits one admitted spec and records its hold line and admission values.
local function admit_one(sp, lines, adm)
    local debits = {}
    if sp.kind == 'B' then
      local b = bucket_load(sp.key, sp.a, sp.b, now)
      bucket_debit(b, sp.cost)
      bucket_save(sp.key, b)
    elseif sp.kind == 'Q' then
      local w = window_id(sp.b, now)
      quota_save(sp.key, sp.b, w, quota_used(sp.key, w) + sp.cost, now)
      debits[1] = { s(w), s(sp.cost) }
    else
      slots_purge(sp.key, now)
      redis.call('ZADD', sp.key, s(now + lease), id)
      slots_expire(sp.key, now)
    end
    if sp.kind ~= 'C' then
      local rem, reset = state_of(sp, now)
      adm[#adm + 1] = s(rem)
      adm[#adm + 1] = s(reset)
    end
    local b = sp.b
    if sp.kind == 'B' then
      b = s(sp.b)
    end
    lines[#lines + 1] = {
      k = sp.key,
      kind = sp.kind,
      a = s(sp.a),
      b = b,
      c = s(sp.cost),
      tok = sp.tok and '1' or '0',
      ref = sp.ref and '1' or '0',
      m = sp.meta,
      d = debits,
    }
end

local function admit(candidate, lo, hi)
  local lines, adm, wd, wd_meta = {}, {}, {}, {}
  local order = {}
  for i = 1, ncommon do
    order[#order + 1] = i
  end
  for i = lo, hi do
    order[#order + 1] = i
  end
  for _, i in ipairs(order) do
    local sp = specs[i]
    if sp.sh and check(i) ~= nil then
      wd[#wd + 1] = s(i - 1)
      wd_meta[#wd_meta + 1] = sp.meta
    else
      admit_one(sp, lines, adm)
    end
  end
  local hold = {
    v = '1',
    id = id,
    now = s(now),
    exp = s(now + hold_ttl),
    lease = s(lease),
    res = s(tokens),
    st = '0',
    cand = s(candidate),
    adm = adm,
    lines = lines,
    wd = wd_meta,
    ext = {},
  }
  hold_save(KEYS[1], hold, now)
  local out = { 'A', s(now), s(candidate), '0', s(#wd) }
  for _, v in ipairs(wd) do
    out[#out + 1] = v
  end
  for _, v in ipairs(adm) do
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
