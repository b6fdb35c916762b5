-- budgetgate settle: apply a hold's final usage exactly once.
-- Mirrors MemoryStore::settle_sync (src/budget/memory/). Defines
-- settle(KEYS, ARGV), one item of a batch (batch.lua); lib.lua is prepended.
-- KEYS and ARGV below are the item's own.
--
-- KEYS[1]        the hold
-- KEYS[2..N+1]   the hold's budget keys, in the hold's line order (none for
--                a settled hold: its tombstone keeps no keys)
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2]        reservation id
-- ARGV[3]        actual tokens used (prompt + completion)
-- ARGV[4]        '1' when the upstream failed before any output (refund
--                upstream budgets too, even where refund_unused is off)
-- ARGV[5]        'V' for mode void: refund every amount and request budget
--                of the hold, refundable or not, free its slots, leave a
--                void tombstone (header state '2'); for an id with no hold,
--                write a void tombstone living ARGV[6] µs. Otherwise '' (every
--                amount line's actual is ARGV[3]) or the actual of each of
--                the reservation's specs by position (packed doubles)
-- ARGV[6]        void only: the hold lifetime, µs
--
-- Per amount line (B, Q), with its own reserved amount (a bucket's d, a
-- quota's debits) and actual: refunds reserved − actual when the line is
-- refundable (never above capacity; a quota only to the window its debits
-- went to, if it is the current one), charges actual − reserved as debt
-- (to the current window; a bucket never below DEBT_FLOOR, a quota count
-- never above MAX_COUNT), frees the slots, and shrinks the hold to its
-- settled tombstone (kept until it expires, so a retried settle answers 'S'
-- and a retried reserve still replays). The reply's refunded and debt
-- compare the common tokens (ARGV[3]) with the hold's. A bucket is counted
-- at its stored rate and burst, not the hold's (a reload may have changed
-- them since the reservation: lib.lua's bucket_stored).
--
-- Reply (strings; sent as one string of space-separated words, lib.lua's
-- words):
--   {'T', now, reserved, refunded, debt, forgiven}  settled now, tokens
--       (forgiven: units of debt that passed a bucket's floor, DEBT_FLOOR)
--   {'U', now} unknown or expired hold   {'S', now} already settled or voided
--   {'V', now} void of an id with no hold: a void tombstone was written
--   {'K', now} KEYS[2..] do not match the hold's keys (refresh and retry)
--
-- Writes (deferred to the end of the batch, once per key): buckets SET PX
-- until full + margin; quotas SET PX until window end + margin; hold SET PX
-- until its expiry + margin. Slots: ZREM of this id, at once (the set keeps
-- its TTL; Redis deletes an empty set).

local function settle(KEYS, ARGV)
  local now = clock(ARGV[1])
  local id = ARGV[2]
  local actual = num(ARGV[3], 'actual')
  local failed = ARGV[4] == '1'
  local void = ARGV[5] == 'V'
  local void_ttl, A = 0, nil
  if void then
    void_ttl = num(ARGV[6], 'hold ttl')
    actual, failed = 0, true
  else
    A = per_spec(ARGV[5])
  end

  load(KEYS)
  local h, early = hold_for_update(raw[KEYS[1]], now, KEYS)
  if h == nil then
    if void and early[1] == 'U' and void_ttl > 0 then
      -- No hold (yet): a reservation arriving later must write nothing.
      local snow = s(now)
      put(KEYS[1], '2 ' .. s(now + void_ttl) .. ' 0 0 ' .. snow .. ' 0 ' .. snow .. ' 0 0\n\n\n\n0\n' .. id,
        ttl_ms(void_ttl))
      return { 'V', snow }
    end
    return early
  end

  local reserved = h.res
  -- Usage comes from the upstream's answer: counts beyond a single cost's
  -- bound are charged as that bound (bucket::to_units).
  if actual > MAX_COST then
    actual = MAX_COST
  end
  -- Units of debt that passed a bucket's floor (counted, never silent).
  local forgiven = 0
  local refunded_any = false
  local snow = s(now)
  -- What a line used: nothing for a void; for an amount line its actual
  -- (at position p, capped at `max`), else the common `actual`; a request
  -- line keeps what it holds.
  local function line_used(amount_line, held, p, max)
    if void then
      return 0
    elseif not amount_line then
      return held
    elseif A == nil then
      return actual
    end
    local used = A[tonumber(p) + 1] or 0
    if used > max then
      return max
    end
    return used
  end
  for i, p, kind, ref, a, b, d in live_lines(h.live) do
    local key = KEYS[i + 1]
    if kind == 'C' then
      -- Expired leases of others are left to the reserve that finds the set
      -- at its limit (it drops them then): one call here instead of two.
      slot_free(key, id)
    elseif (kind == 'b' or kind == 'q') and not void then
      -- Request budgets: only a void gives them back.
    elseif kind == 'B' or kind == 'b' then
      -- At the stored rate and burst: a hold admitted under an older
      -- policy must not write it back (bucket_stored).
      local level, last, per_minute, burst = bucket_stored(raw[key], tonumber(a), tonumber(b), now)
      local cap = burst * UNITS
      local held = tonumber(d)
      local used = line_used(kind == 'B', held, p, MAX_COST)
      if used < held and (ref == '1' or failed) then
        level = level + (held - used) * UNITS
        if level > cap then
          level = cap
        end
        refunded_any = true
      elseif used > held then
        local passed
        level, passed = bucket_debit(level, (used - held) * UNITS)
        forgiven = forgiven + passed
      end
      put(key, pack('<dddd', level, last, per_minute, burst),
        ttl_ms(refill_wait(cap - level, per_minute, now, last)))
    elseif ROLL[b] ~= nil then
      -- A rolling window (Inner::settle_line): a refund goes back to the
      -- sub-buckets the hold debited, debt to the sub-bucket of now.
      local total, e = roll_at(raw[key], b, now)
      local held = debited(d, nil)
      local used = line_used(kind == 'Q', held, p, MAX_AMOUNT)
      if used < held and (ref == '1' or failed) then
        total, e = roll_refund(total, e, b, now, d, held - used)
        refunded_any = true
      elseif used > held then
        total, e = roll_debit(total, e, b, now, used - held)
      end
      roll_put(key, total, e, b, now)
    else
      local w, wend = window(b, now, raw[key])
      local count = quota_used(raw[key], w)
      local held = debited(d, nil)
      local used = line_used(kind == 'Q', held, p, MAX_AMOUNT)
      if used < held and (ref == '1' or failed) then
        -- Only what went to the current window comes back.
        count = math.max(count - math.min(held - used, debited(d, w)), 0)
        refunded_any = true
      elseif used > held then
        count = math.min(count + used - held, MAX_COUNT)
      end
      -- A settlement that charges nothing after a window from first use
      -- ended must not start the next one (Inner::settle_line).
      if count > 0 or FIRST[b] == nil or (raw[key] and unpack_('<d', raw[key]) == w) then
        put(key, pack('<dd', w, count), ttl_ms(wend - now))
      end
    end
  end
  local refunded, debt = 0, math.max(actual - reserved, 0)
  if refunded_any then
    refunded = math.max(reserved - actual, 0)
  end
  -- The tombstone: header (settled), no keys, no live entries, the
  -- extensions, an empty adm ('0': a replayed reserve reports no budgets) and
  -- the id. It lives as long as the hold would have (a retried settle must
  -- still find it), so it is kept small.
  -- (Most settlements refund nothing or charge no debt: '0' formats nothing.)
  local srefunded, sdebt = '0', '0'
  local state = '1 '
  if void then
    refunded, state = reserved, '2 '
  end
  if refunded ~= 0 then
    srefunded = s(refunded)
  end
  if debt ~= 0 then
    sdebt = s(debt)
  end
  put(KEYS[1], state .. h.head .. ' ' .. snow .. ' ' .. srefunded .. ' ' .. sdebt .. '\n\n\n' .. h.ext
    .. '\n0\n' .. id, ttl_ms(h.exp - now))
  return { 'T', snow, h.res_s, srefunded, sdebt, forgiven }
end
