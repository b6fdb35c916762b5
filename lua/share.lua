-- budgetgate shares: fleet-wide weighted shares of a contended deployment.
-- Mirrors src/budget/share.rs line for line (its module doc states the
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
-- step, and its order O (ClaimOrder: { id, waited µs, left µs }; nil when
-- the id is 0). Every number is checked here, before any write.
local function share_claim(arg, KEYS, q)
  if arg == nil or arg == '' then
    return nil
  end
  local SH, t, r, step, O, j = {}, nil, nil, nil, {}, 0
  for w in string.gmatch(arg, '%S+') do
    j = j + 1
    if j == 1 then
      t = w
    elseif j == 2 then
      r = num(w, 'share rank')
    elseif j == 3 then
      step = num(w, 'share step')
    elseif j <= 6 then
      O[j - 3] = num(w, 'share order')
    else
      SH[num(w, 'share candidate')] = KEYS[q + j - 6]
    end
  end
  if O[1] == 0 then
    O = nil
  end
  return SH, t, r, step, O
end

-- The live entries of stored value `v` (false when absent): { tenant, rank,
-- lead, waited, admitted, pending, first } each; first (FirstWaiter) is
-- { rank, since, id, until } or nil, stored as ' f<rank>:<since>:<id>:<until>'
-- after the pending flag (an entry an older script does not parse).
local function share_read(v, now)
  local E = {}
  if v then
    for t, r, l, w, a, p, f in string.gmatch(v, '([^ ;]+) (%d+) (%d+) (%d+) (%d+) ([01])([^;]*);') do
      w, a = tonumber(w), tonumber(a)
      if (w > a and w or a) + SHARE_ACTIVE > now then
        local first = nil
        local fr, fs, fi, fu = string.match(f, '^ f(%d+):(%d+):(%d+):(%d+)$')
        if fr ~= nil and tonumber(fu) > now then
          first = { tonumber(fr), tonumber(fs), tonumber(fi), tonumber(fu) }
        end
        E[#E + 1] = { t, tonumber(r), tonumber(l), w, a, p == '1', first }
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

-- (rank a, since b) comes before (rank c, since d).
local function share_before(a, b, c, d)
  return a < c or (a == c and b < d)
end

-- ShareState::holds_back: another tenant is pending with a lower rank, or
-- was refused within SHARE_ACTIVE with the same rank and a smaller lead;
-- or (behind_first) the claim's own tenant has a first waiter before it.
local function share_holds_back(E, t, rank, O, now)
  local me = share_find(E, t)
  local lead = me and me[3] or share_least(E)
  for i = 1, #E do
    local e = E[i]
    if e[1] == t then
      local f = e[7]
      if O ~= nil and f ~= nil and O[3] > 0 and f[3] ~= O[1]
          and share_before(f[1], f[2], rank, math.max(now - O[2], 0)) then
        return true
      end
    elseif (e[2] < rank and e[6])
        or (e[2] == rank and e[4] > 0 and e[4] + SHARE_ACTIVE > now and e[3] < lead) then
      return true
    end
  end
  return false
end

local function share_entry(E, t, rank)
  local e = share_find(E, t)
  if e == nil then
    e = { t, rank, share_least(E), 0, 0, false, nil }
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
    local f = ''
    if e[7] ~= nil then
      f = ' f' .. s(e[7][1]) .. ':' .. s(e[7][2]) .. ':' .. s(e[7][3]) .. ':' .. s(e[7][4])
    end
    parts[i] = e[1] .. ' ' .. s(e[2]) .. ' ' .. s(e[3]) .. ' ' .. s(e[4]) .. ' ' .. s(e[5])
      .. (e[6] and ' 1' or ' 0') .. f .. ';'
  end
  put(key, table.concat(parts), ttl_ms(SHARE_ACTIVE))
end

-- ShareState::admitted: the lead grows by `step`, at most SHARE_GAP steps
-- above the least.
local function share_admitted(key, E, t, rank, step, O, now)
  local least = share_least(E)
  local e = share_entry(E, t, rank)
  local lead = e[3] + step
  local cap = least + SHARE_GAP * step
  if lead > cap then
    lead = cap
  end
  e[2], e[3], e[5], e[6] = rank, lead, now, false
  -- The first waiter admitted leaves its place.
  if O ~= nil and e[7] ~= nil and e[7][3] == O[1] then
    e[7] = nil
  end
  share_write(key, E)
end

-- ShareState::refused: the claim's waiter becomes its tenant's first if it
-- comes before the one known, keeps its place if it is it, gives it up on
-- its last attempt.
local function share_refused(key, E, t, rank, O, now)
  local e = share_entry(E, t, rank)
  e[2], e[4], e[6] = rank, now, true
  if O ~= nil then
    local f = e[7]
    if O[3] == 0 then
      if f ~= nil and f[3] == O[1] then
        e[7] = nil
      end
    else
      local untl = now + math.min(SHARE_ACTIVE, O[3])
      local since = math.max(now - O[2], 0)
      if f ~= nil and f[3] == O[1] then
        f[4] = untl
      elseif f == nil or share_before(rank, since, f[1], f[2]) then
        e[7] = { rank, since, O[1], untl }
      end
    end
  end
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
  elseif kind == 2 and ROLL[WL[b]] ~= nil then
    local total, e = roll_at(v, WL[b], now)
    avail = a - total
    reset = roll_until_empty(e, WL[b], now)
  elseif kind == 2 then
    local w, wend = window(WL[b], now, v or legacy)
    avail = a - quota_used_at(v, legacy, w)
    reset = wend - now
  else
    avail = a - call('ZCOUNT', key, '(' .. snow, '+inf')
  end
  return { 'S', i, avail, retry, reset }
end
