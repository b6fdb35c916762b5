-- budgetgate shares: fleet-wide weighted shares of a contended deployment.
-- Mirrors src/reserve/share.rs line for line (its module doc states the
-- rules and the bounds: every number an integer below 2^53). lib.lua is
-- prepended; reserve.lua calls these.
--
-- Stored at a deployment's share key (`<…>:upstream:<deployment>:share`,
-- the deployment's hash tag): one string of entries, in order of arrival,
--   '<tenant> <rank> <lead> <waited µs> <admitted µs> <pending 0|1>;'
-- (tenant ids are [A-Za-z0-9._-]: no separator). Written only when a claim
-- is refused by the deployment, or counted while the state lives; TTL:
-- SHARE_ACTIVE after the last write + margin. Entries whose last claim
-- (refusal or admission) is SHARE_ACTIVE old are dropped when read, and a
-- state without live entries counts as absent.

-- The claim of reserve.lua's share argument `arg` ('' or nil: none), the
-- share keys following KEYS[q]: SH (candidate → share key), tenant, rank,
-- step. Every number is checked here, before any write.
local function share_claim(arg, KEYS, q)
  if arg == nil or arg == '' then
    return nil
  end
  local SH, t, r, step, j = {}, nil, nil, nil, 0
  for w in string.gmatch(arg, '%S+') do
    j = j + 1
    if j == 1 then
      t = w
    elseif j == 2 then
      r = num(w, 'share rank')
    elseif j == 3 then
      step = num(w, 'share step')
    else
      SH[num(w, 'share candidate')] = KEYS[q + j - 3]
    end
  end
  return SH, t, r, step
end

-- The live entries of stored value `v` (false when absent): { tenant, rank,
-- lead, waited, admitted, pending } each.
local function share_read(v, now)
  local E = {}
  if v then
    for t, r, l, w, a, p in string.gmatch(v, '([^ ;]+) (%d+) (%d+) (%d+) (%d+) ([01]);') do
      w, a = tonumber(w), tonumber(a)
      if (w > a and w or a) + SHARE_ACTIVE > now then
        E[#E + 1] = { t, tonumber(r), tonumber(l), w, a, p == '1' }
      end
    end
  end
  return E
end

local function share_least(E)
  local m = nil
  for i = 1, #E do
    if m == nil or E[i][3] < m then
      m = E[i][3]
    end
  end
  return m or 0
end

local function share_find(E, t)
  for i = 1, #E do
    if E[i][1] == t then
      return E[i]
    end
  end
  return nil
end

-- ShareState::holds_back: another tenant is pending with a lower rank, or
-- was refused within SHARE_ACTIVE with the same rank and a smaller lead.
local function share_holds_back(E, t, rank, now)
  local me = share_find(E, t)
  local lead = me and me[3] or share_least(E)
  for i = 1, #E do
    local e = E[i]
    if e[1] ~= t and ((e[2] < rank and e[6])
        or (e[2] == rank and e[4] > 0 and e[4] + SHARE_ACTIVE > now and e[3] < lead)) then
      return true
    end
  end
  return false
end

local function share_entry(E, t, rank)
  local e = share_find(E, t)
  if e == nil then
    e = { t, rank, share_least(E), 0, 0, false }
    E[#E + 1] = e
  end
  return e
end

-- Lowers every lead by the least one and writes the state.
local function share_write(key, E)
  local least = share_least(E)
  local parts = {}
  for i = 1, #E do
    local e = E[i]
    e[3] = e[3] - least
    parts[i] = e[1] .. ' ' .. s(e[2]) .. ' ' .. s(e[3]) .. ' ' .. s(e[4]) .. ' ' .. s(e[5])
      .. (e[6] and ' 1;' or ' 0;')
  end
  put(key, table.concat(parts), ttl_ms(SHARE_ACTIVE))
end

-- ShareState::admitted: the lead grows by `step`, at most SHARE_GAP steps
-- above the least.
local function share_admitted(key, E, t, rank, step, now)
  local least = share_least(E)
  local e = share_entry(E, t, rank)
  local lead = e[3] + step
  local cap = least + SHARE_GAP * step
  if lead > cap then
    lead = cap
  end
  e[2], e[3], e[5], e[6] = rank, lead, now, false
  share_write(key, E)
end

-- ShareState::refused.
local function share_refused(key, E, t, rank, now)
  local e = share_entry(E, t, rank)
  e[2], e[4], e[6] = rank, now, true
  share_write(key, E)
end

-- share::named_spec over specs lo..hi (numbers V as reserve.lua reads
-- them): the first enforced token bucket, else the first enforced spec.
local function share_named(V, lo, hi)
  for i = lo, hi do
    if V[5 * i] ~= 1 and V[5 * i - 4] == 1 then
      return i
    end
  end
  for i = lo, hi do
    if V[5 * i] ~= 1 then
      return i
    end
  end
  return nil
end

-- The refusal of a claim of `cost` held back on spec i (stored value v at
-- `key`, the previous layout's quota `legacy`): {'S', i, available,
-- retry µs (share::retry_micros), reset µs}.
local function share_refusal(V, i, cost, v, key, legacy, now, snow)
  local o = 5 * i - 5
  local kind, a, b = V[o + 1], V[o + 2], V[o + 3]
  local avail, reset, retry = 0, 0, SHARE_RETRY
  if kind == 1 then
    local level, last = bucket_at(v, b, now)
    avail = fdiv(level, UNITS)
    reset = refill_wait(b * UNITS - level, a, now, last)
    if a > 0 then
      local ms = cdiv(cost * UNITS, a)
      if ms < 1 then
        ms = 1
      elseif ms > MAX_WAIT_MS then
        ms = MAX_WAIT_MS
      end
      retry = ms * 1000
    end
  elseif kind == 2 then
    local w, wend = window(b == 0 and 'D' or 'M', now)
    avail = a - quota_used_at(v, legacy, w)
    reset = wend - now
  else
    avail = a - call('ZCOUNT', key, '(' .. snow, '+inf')
  end
  return { 'S', i, avail, retry, reset }
end
