-- budgetgate lease: quota leases (src/budget/quota_lease.rs has the semantics
-- and the bounds): grant, top-up, report, give back and end, fenced by the
-- budget's policy epoch; and the read of what is out on leases.
-- Mirrors src/budget/memory/quota_lease.rs step for step; lib.lua is prepended.
--
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2]        'L' apply lease lines | 'O' read what is out on leases
--
-- Mode 'L', N lines (all of one budget domain), 4 keys per line i:
-- KEYS[4i-3]     the lease record (KeySpace::lease)
-- KEYS[4i-2]     the budget's epoch record (KeySpace::budget_epoch)
-- KEYS[4i-1]     the budget key (bucket, quota counter or slot set)
-- KEYS[4i]       a quota's counter under the previous key layout (read while
--                the current one is absent); else the budget key again
-- ARGV[3]        10 numbers per line, packed little-endian doubles (exact
--                integers, already bounded by LeaseLine::bounded): kind (1
--                bucket, 2 quota, 3 concurrency), a, b (as in reserve.lua:
--                per_minute and burst | limit and 0 day / 1 month | max and
--                0), seq, want, give_back, spent, end (0 | 1), ttl µs,
--                record ttl µs
-- ARGV[2+2i]     line i's lease id, percent-encoded (no spaces, ';' or '#';
--                possibly empty)
-- ARGV[3+2i]     line i's policy as text: 'B <per_minute> <burst>' |
--                'Q <limit> D|M' | 'C <max> 0' (compared with the stored one)
--
-- Reply (flat array of strings), per line one of
--   'L' epoch granted given_back granted_now expires now free window|'-' recall
--                             (recall: '1' while the budget's recall is on,
--                             '0' otherwise and for a replayed line)
--   'E' given_back now        ended (given_back: what reached the budget)
--   'F' epoch now             fenced (epoch: the budget's current one)
--   'U' now                   no record
-- then the units of debt that passed a bucket's floor (forgiven).
--
-- Mode 'O': KEYS are epoch records; reply per key: epoch, live leases, units
-- out on them (epoch '1', '0', '0' without a live epoch record).
--
-- Stored values (every key written with a TTL: its logical end + margin):
--   lease record   struct.pack of 12 doubles: status (0 live, 1 ended, 2
--                  fenced), epoch, granted, given_back, returned (of
--                  given_back, what reached the budget), spent, seq,
--                  expires µs, kept-until µs, window id (-1 none), free of
--                  the last live reply, the epoch that fenced it
--   epoch record   text "<epoch> <kept-until µs> <policy>\n" then one entry
--                  "<lease id> <expires µs> <unspent units>;" per live lease,
--                  and "! <recall until µs> 0;" while a recall is on (no
--                  lease id is '!': ids are percent-encoded)
--   budget         bucket / quota state as lib.lua describes; a concurrency
--                  lease's slots are members "<lease id>#<n>" of the slot
--                  set, n in (given_back, granted], scored with its expiry
-- Reads: one MGET per 1,000 keys; ZCOUNT per concurrency line.

local LIVE, ENDED, FENCED = 0, 1, 2
local REC = '<' .. string.rep('d', 12)

-- Epoch records read or written in this call, by key (a line may follow
-- another of the same budget): { epoch, untl, policy, ids (order), exp[id],
-- units[id] }; nil for absent or past its kept-until.
local books = {}
local function book_at(key, now)
  local e = books[key]
  if e ~= nil then
    if e.untl > now then
      return e
    end
    return nil
  end
  local v = raw[key]
  if not v then
    return nil
  end
  local epoch, untl, policy, rest = match(v, '^(%d+) (%d+) ([^\n]*)\n(.*)$')
  if not epoch then
    error('budgetgate: bad epoch record at ' .. key)
  end
  e = { epoch = tonumber(epoch), untl = tonumber(untl), policy = policy, ids = {}, exp = {}, units = {}, recall = 0 }
  for id, x, u in string.gmatch(rest, '([^ ;]*) (%d+) (%d+);') do
    if id == '!' then
      e.recall = tonumber(x)
    else
      e.ids[#e.ids + 1] = id
      e.exp[id], e.units[id] = tonumber(x), tonumber(u)
    end
  end
  books[key] = e
  if e.untl > now then
    return e
  end
  return nil
end

-- Epoch records changed in this call, written once each at its end (a
-- call of many lines on one budget would otherwise rewrite its list once
-- per line).
local books_dirty, books_order = {}, {}

local function book_text(e, now)
  local parts, seen = { s(e.epoch) .. ' ' .. s(e.untl) .. ' ' .. e.policy .. '\n' }, {}
  for _, id in ipairs(e.ids) do
    local x = e.exp[id]
    if x ~= nil and x > now and not seen[id] then
      seen[id] = true
      parts[#parts + 1] = id .. ' ' .. s(x) .. ' ' .. s(e.units[id]) .. ';'
    end
  end
  if e.recall > now then
    parts[#parts + 1] = '! ' .. s(e.recall) .. ' 0;'
  end
  return table.concat(parts)
end

local forgiven = 0

-- What the budget has for others now (whole units; negative in debt).
local function available(kind, a, b, bkey, legacy, now, snow)
  if kind == 1 then
    local level = bucket_at(raw[bkey], b, now)
    return fdiv(level, UNITS)
  elseif kind == 2 and ROLL[WL[b]] ~= nil then
    return a - roll_at(raw[bkey], WL[b], now)
  elseif kind == 2 then
    local lv = legacy and raw[legacy]
    local w = window(WL[b], now, raw[bkey] or lv)
    return a - quota_used_at(raw[bkey], lv, w)
  end
  return a - call('ZCOUNT', bkey, '(' .. snow, '+inf')
end

local function put_bucket(bkey, level, last, a, b, now)
  put(bkey, pack('<dddd', level, last, a, b), ttl_ms(refill_wait(b * UNITS - level, a, now, last)))
end

local function put_quota(bkey, w, used, wend, now)
  put(bkey, pack('<dd', w, used), ttl_ms(wend - now))
end

-- Takes `units` from the budget: a grant (fits what is free; under the
-- line's policy, as a reservation) or debt (at the stored rate and burst:
-- a lease granted under an older policy never writes it back).
local function take(kind, a, b, bkey, legacy, units, debt, now)
  if kind == 1 then
    local level, last
    if debt then
      level, last, a, b = bucket_stored(raw[bkey], a, b, now)
    else
      level, last = bucket_at(raw[bkey], b, now)
    end
    if units > MAX_COST then
      units = MAX_COST
    end
    local passed
    level, passed = bucket_debit(level, units * UNITS)
    forgiven = forgiven + passed
    put_bucket(bkey, level, last, a, b, now)
  elseif kind == 2 and ROLL[WL[b]] ~= nil then
    -- A grant or debt goes to the sub-bucket of now (Rolling::debit).
    local wl = WL[b]
    if debt and units > MAX_AMOUNT then
      units = MAX_AMOUNT
    end
    local total, e = roll_at(raw[bkey], wl, now)
    total, e = roll_debit(total, e, wl, now, units)
    roll_put(bkey, total, e, wl, now)
  elseif kind == 2 then
    local lv = legacy and raw[legacy]
    local w, wend = window(WL[b], now, raw[bkey] or lv)
    local used = quota_used_at(raw[bkey], lv, w)
    if debt then
      if units > MAX_AMOUNT then
        units = MAX_AMOUNT
      end
      used = math.min(used + units, MAX_COUNT)
    else
      used = used + units
    end
    put_quota(bkey, w, used, wend, now)
  end
end

-- Members "<id>#<n>" for n in [from, to], scored `score`, in chunks (unpack's stack).
local function members_put(bkey, id, from, to, score, ttl)
  local c = slots_card(bkey)
  local added, n = 0, from
  while n <= to do
    local args, j = {}, 0
    while n <= to and j < 400 do
      args[j + 1], args[j + 2] = score, id .. '#' .. s(n)
      j, n = j + 2, n + 1
    end
    added = added + call('ZADD', bkey, unpack(args))
  end
  card[bkey] = c + added
  -- The set's TTL as slot_take keeps it: until its longest lease + margin.
  local e = expiring[bkey]
  if e == nil then
    expiring_order[#expiring_order + 1] = bkey
  end
  if c == 0 or e == nil then
    expiring[bkey] = { ttl, c == 0 }
  elseif ttl > e[1] then
    e[1] = ttl
  end
end

local function members_free(bkey, id, from, to)
  local n = from
  while n <= to do
    local args, j = {}, 0
    while n <= to and j < 400 do
      args[j + 1] = id .. '#' .. s(n)
      j, n = j + 1, n + 1
    end
    local removed = call('ZREM', bkey, unpack(args))
    if card[bkey] ~= nil then
      card[bkey] = card[bkey] - removed
    end
  end
end

-- Returns `units` unspent units of lease record r to the budget (a bucket
-- at its stored rate and burst); answers what reached it (whole units).
local function give(kind, a, b, bkey, legacy, id, r, units, now)
  if kind == 1 then
    local level, last
    level, last, a, b = bucket_stored(raw[bkey], a, b, now)
    local cap = b * UNITS
    local room = fdiv(cap - level, UNITS)
    local u = units
    if u > MAX_COST then
      u = MAX_COST
    end
    level = math.min(level + u * UNITS, cap)
    put_bucket(bkey, level, last, a, b, now)
    return math.min(units, math.max(room, 0))
  elseif kind == 2 and ROLL[WL[b]] ~= nil then
    -- A lease lives within the sub-bucket it was granted in (its expiry is
    -- capped at the sub-bucket's end): its units go back there only.
    local wl = WL[b]
    local w = window(wl, now)
    if r[10] ~= w then
      return 0
    end
    local total, e = roll_at(raw[bkey], wl, now)
    local back
    total, e, back = roll_credit(total, e, w, units)
    roll_put(bkey, total, e, wl, now)
    return back
  elseif kind == 2 then
    local lv = legacy and raw[legacy]
    local w, wend = window(WL[b], now, raw[bkey] or lv)
    if r[10] ~= w then
      return 0
    end
    local used = quota_used_at(raw[bkey], lv, w)
    local back = math.min(units, used)
    put_quota(bkey, w, used - back, wend, now)
    return back
  end
  members_free(bkey, id, r[4] + 1, r[4] + units)
  return units
end

local function reply_of(r, snow, granted_now, recall, out)
  local st = r[1]
  if st == LIVE then
    local w = '-'
    if r[10] >= 0 then
      w = s(r[10])
    end
    out[#out + 1] = 'L'
    out[#out + 1] = s(r[2])
    out[#out + 1] = s(r[3])
    out[#out + 1] = s(r[4])
    out[#out + 1] = s(granted_now)
    out[#out + 1] = s(r[8])
    out[#out + 1] = snow
    out[#out + 1] = s(r[11])
    out[#out + 1] = w
    out[#out + 1] = recall and '1' or '0'
  elseif st == ENDED then
    out[#out + 1] = 'E'
    out[#out + 1] = s(r[5])
    out[#out + 1] = snow
  else
    out[#out + 1] = 'F'
    out[#out + 1] = s(r[12])
    out[#out + 1] = snow
  end
end

-- Line i (its 10 numbers at byte 80(i - 1) + 1 of `nums`); appends its
-- reply to `out`. Read line by line: one unpack of every line's numbers
-- would pass Lua's limit of results (~8,000) at 800 lines.
local function lease_line(i, nums, now, snow, out)
  local k = 4 * i - 4
  local rkey, ekey, bkey, legacy = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4]
  if legacy == bkey then
    legacy = nil
  end
  local kind, a, b, seq, want, give_back, spent, fin, ttl, rttl =
    unpack_('<dddddddddd', nums, 80 * i - 79)
  fin = fin == 1
  local id, policy = ARGV[2 + 2 * i], ARGV[3 + 2 * i]

  local prior = nil
  local rv = raw[rkey]
  if rv then
    local r = { unpack_(REC, rv) }
    if r[9] > now then
      prior = r
    end
  end
  if prior ~= nil and (seq <= prior[7] or prior[1] ~= LIVE) then
    reply_of(prior, snow, 0, false, out)
    return
  end
  if prior == nil and seq ~= 1 then
    out[#out + 1] = 'U'
    out[#out + 1] = snow
    return
  end

  -- The budget's epoch: a new record (epoch 1) when it has none, the next
  -- epoch when a line that asks for units carries another policy than the
  -- stored one.
  local e = book_at(ekey, now)
  if e == nil then
    e = { epoch = 1, untl = now, policy = policy, ids = {}, exp = {}, units = {}, recall = 0 }
    books[ekey] = e
  elseif want > 0 and e.policy ~= policy then
    e.epoch = e.epoch + 1
    e.policy = policy
    -- As a refused reservation's adopt_policies (reserve.lua).
    local v = raw[bkey]
    if kind == 1 and v then
      local _, _, rate, sburst = unpack_('<dddd', v)
      if rate ~= a or sburst ~= b then
        local level, last = bucket_at(v, b, now)
        put_bucket(bkey, level, last, a, b, now)
      end
    end
  end

  local w, wend = -1, nil
  if kind == 2 then
    w, wend = window(WL[b], now, raw[bkey] or (legacy and raw[legacy]))
  end
  local r = prior
  if r == nil then
    r = { LIVE, e.epoch, 0, 0, 0, 0, seq, 0, 0, w, 0, 0 }
  end
  r[7] = seq

  -- Report: spent beyond what the lease holds is debt, charged now.
  if kind == 3 then
    r[6] = spent
  else
    -- The latest report stands: refunds lower it (lines apply in seq order).
    r[6] = spent
    local held = r[3] - r[4]
    if r[6] > held then
      local debt = r[6] - held
      take(kind, a, b, bkey, legacy, debt, true, now)
      r[3] = math.min(r[3] + debt, MAX_COUNT)
    end
  end

  local granted_now = 0
  local recall = false
  if r[2] ~= e.epoch then
    r[1], r[12] = FENCED, e.epoch
  elseif prior ~= nil and r[8] <= now then
    r[1] = ENDED
  else
    local expires = now + ttl
    if kind == 2 and wend < expires then
      expires = wend
    end
    if want > 0 then
      local free = available(kind, a, b, bkey, legacy, now, snow)
      if free < 0 then
        free = 0
      end
      local g = math.min(want, fdiv(free, 2), MAX_COUNT - r[3])
      if g > 0 then
        take(kind, a, b, bkey, legacy, g, false, now)
        r[3] = r[3] + g
        granted_now = g
      end
    end
    local unspent = math.max(r[3] - r[4] - r[6], 0)
    local back = unspent
    if not fin and give_back < unspent then
      back = give_back
    end
    local first_kept = r[4] + back
    if back > 0 then
      r[5] = r[5] + give(kind, a, b, bkey, legacy, id, r, back, now)
      r[4] = r[4] + back
    end
    if fin then
      r[1] = ENDED
    else
      r[8] = expires
      if kind == 3 and r[3] > first_kept then
        members_put(bkey, id, first_kept + 1, r[3], s(expires), ttl_ms(expires - now))
      end
      r[11] = available(kind, a, b, bkey, legacy, now, snow)
      -- Recall: a want granted short while other live leases hold units
      -- starts one for a lease's ttl; a want granted in full ends it.
      if want > 0 and granted_now < want then
        local held = false
        for _, other in ipairs(e.ids) do
          local x = e.exp[other]
          if other ~= id and x ~= nil and x > now and e.units[other] > 0 then
            held = true
          end
        end
        if held and now + ttl > e.recall then
          e.recall = now + ttl
        end
      elseif want > 0 then
        e.recall = 0
      end
      recall = e.recall > now
    end
  end

  r[9] = now + rttl
  put(rkey, pack(REC, unpack(r)), ttl_ms(rttl))
  if r[9] > e.untl then
    e.untl = r[9]
  end
  if e.exp[id] == nil then
    e.ids[#e.ids + 1] = id
  end
  if r[1] == LIVE then
    e.exp[id], e.units[id] = r[8], math.max(r[3] - r[4] - r[6], 0)
  else
    e.exp[id] = nil
  end
  if not books_dirty[ekey] then
    books_dirty[ekey] = true
    books_order[#books_order + 1] = ekey
  end
  reply_of(r, snow, granted_now, recall, out)
end

local now = clock(ARGV[1])
local snow = s(now)
-- Every string key in one MGET per 1,000 keys (unpack's limit of results).
for i = 1, #KEYS, 1000 do
  local part = {}
  for j = i, math.min(i + 999, #KEYS) do
    part[#part + 1] = KEYS[j]
  end
  load(part)
end
local out = {}
if ARGV[2] == 'O' then
  for i = 1, #KEYS do
    local e = book_at(KEYS[i], now)
    if e == nil then
      out[#out + 1] = '1'
      out[#out + 1] = '0'
      out[#out + 1] = '0'
    else
      local n, units, seen = 0, 0, {}
      for _, id in ipairs(e.ids) do
        local x = e.exp[id]
        if x ~= nil and x > now and not seen[id] then
          seen[id] = true
          n, units = n + 1, units + e.units[id]
        end
      end
      out[#out + 1] = s(e.epoch)
      out[#out + 1] = s(n)
      out[#out + 1] = s(units)
    end
  end
  return out
end
local n = #KEYS / 4
if #ARGV[3] ~= 80 * n then
  error('budgetgate: lease numbers for ' .. n .. ' lines: ' .. #ARGV[3] .. ' bytes')
end
for i = 1, n do
  lease_line(i, ARGV[3], now, snow, out)
end
for _, key in ipairs(books_order) do
  local e = books[key]
  put(key, book_text(e, now), ttl_ms(e.untl - now))
end
flush()
out[#out + 1] = s(forgiven)
return out
