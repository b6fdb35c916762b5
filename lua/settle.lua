-- budgetgate settle: apply a hold's final usage exactly once.
-- Mirrors MemoryStore::settle_sync (src/reserve/memory/). Defines
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
-- ARGV[5]        'V' for mode void (absent otherwise): refund every token and
--                request budget of the hold, refundable or not, free its
--                slots, leave a void tombstone (header state '2'); for an id
--                with no hold, write a void tombstone living ARGV[6] µs
-- ARGV[6]        void only: the hold lifetime, µs
--
-- Refunds reserved − actual to every refundable token budget (never above
-- capacity; a quota only to the window its debits went to, if it is the
-- current one), charges actual − reserved as debt (to the current window),
-- frees the slots, and shrinks the hold to its settled tombstone (kept until
-- it expires, so a retried settle answers 'S' and a retried reserve still
-- replays).
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
  local void_ttl = 0
  if void then
    void_ttl = num(ARGV[6], 'hold ttl')
    actual, failed = 0, true
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
  local unused = math.max(reserved - actual, 0)
  local debt = math.max(actual - reserved, 0)
  local refunded = 0
  local snow = s(now)
  for i, kind, ref, a, b, d in live_lines(h.live) do
    local key = KEYS[i + 1]
    if kind == 'C' then
      -- Expired leases of others are left to the reserve that finds the set
      -- at its limit (it drops them then): one call here instead of two.
      slot_free(key, id)
    elseif kind == 'b' or kind == 'q' then
      -- Request budgets: only a void gives them back.
      if void then
        if kind == 'b' then
          local per_minute, burst = tonumber(a), tonumber(b)
          local level, last = bucket_at(raw[key], burst, now)
          local cap = burst * UNITS
          level = level + tonumber(d) * UNITS
          if level > cap then
            level = cap
          end
          put(key, pack('<dddd', level, last, per_minute, burst),
            ttl_ms(refill_wait(cap - level, per_minute, now, last)))
        else
          local w, wend = window(b, now)
          local used = quota_used(raw[key], w)
          for dw, da in string.gmatch(d, '(%d+):(%d+)') do
            if tonumber(dw) == w then
              used = used - tonumber(da)
            end
          end
          if used < 0 then
            used = 0
          end
          put(key, pack('<dd', w, used), ttl_ms(wend - now))
        end
      end
    else
      local refundable = ref == '1' or failed
      if kind == 'B' then
        local per_minute, burst = tonumber(a), tonumber(b)
        local level, last = bucket_at(raw[key], burst, now)
        local cap = burst * UNITS
        if unused > 0 and refundable then
          level = level + unused * UNITS
          if level > cap then
            level = cap
          end
          refunded = unused
        end
        if debt > 0 then
          local passed
          level, passed = bucket_debit(level, debt * UNITS)
          forgiven = forgiven + passed
        end
        put(key, pack('<dddd', level, last, per_minute, burst),
          ttl_ms(refill_wait(cap - level, per_minute, now, last)))
      else
        local w, wend = window(b, now)
        local used = quota_used(raw[key], w)
        if unused > 0 and refundable then
          local here = 0
          for dw, da in string.gmatch(d, '(%d+):(%d+)') do
            if tonumber(dw) == w then
              here = here + tonumber(da)
            end
          end
          used = math.max(used - math.min(unused, here), 0)
          refunded = unused
        end
        if debt > 0 then
          used = used + debt
        end
        put(key, pack('<dd', w, used), ttl_ms(wend - now))
      end
    end
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
