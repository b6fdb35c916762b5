-- budgetgate extend: debit more output from every amount budget of a hold.
-- Mirrors MemoryStore::extend_sync (src/budget/memory/); lib.lua is prepended.
--
-- KEYS[1]        the hold
-- KEYS[2..N+1]   the hold's budget keys, in the hold's line order
-- ARGV[1]        now, UTC µs; '' = Redis TIME (only test builds pass a value)
-- ARGV[2]        reservation id
-- ARGV[3]        tokens wanted
-- ARGV[4]        '' (every amount line at rate RATE_ONE: one unit per token),
--                or the rate of each of the reservation's specs by position
--                (packed doubles): units per RATE_ONE tokens, ≤ MAX_RATE
--
-- Grants all of `want` when every amount line can pay for it, else the
-- largest number of tokens g all can pay for (≥ 1), debiting each line
-- ceil(g × rate / RATE_ONE) (lib.lua's rate_grant, rate_debit); when not
-- even 1 token fits, nothing is written. Quota extensions go to the window
-- current now. The tightest line is the one granting least (the lowest
-- available among equals, then the first). Buckets are counted at their
-- stored rate and burst, not the hold's (lib.lua's bucket_stored).
--
-- Reply (strings):
--   {'E', now, granted}                              extended by `granted` tokens
--   {'X', now, line index (0-based), available, retry_after µs (for 1 token's debit), reset µs}
--                                                    exhausted: the tightest budget
--   {'U', now} unknown or expired hold   {'S', now} already settled
--   {'K', now} KEYS[2..] do not match the hold's keys (refresh and retry)
--
-- Writes: buckets SET PX until full + margin; quotas SET PX until window end
-- + margin; hold SET PX until its expiry + margin (res, the quota debits and
-- the extension list updated).

local now = clock(ARGV[1])
local want = num(ARGV[3], 'want')
if want > MAX_COST then
  want = MAX_COST
end
local R = per_spec(ARGV[4])

local raw = load_all()
local h, early = hold_for_update(raw[KEYS[1]], now, KEYS)
if h == nil then
  return early
end

local grant = want
local tight, tight_cap, tight_avail = nil, nil, nil
local lines = {}
for i, p, kind, ref, a, b, d in live_lines(h.live) do
  local ln = { i = tonumber(i), p = p, key = KEYS[i + 1], kind = kind, ref = ref, a = tonumber(a), b = b, bs = b, d = d }
  lines[#lines + 1] = ln
  if kind == 'B' or kind == 'Q' then
    local rate = RATE_ONE
    if R ~= nil then
      rate = R[tonumber(p) + 1] or 0
    end
    ln.rate = rate
    if rate > 0 then
      local avail
      if kind == 'B' then
        -- At the stored rate and burst (bucket_stored): the hold's
        -- policy may be older than the bucket's.
        local level, last
        level, last, ln.sa, ln.sb = bucket_stored(raw[ln.key], ln.a, tonumber(b), now)
        avail = fdiv(level, UNITS)
      elseif ROLL[b] ~= nil then
        avail = ln.a - roll_at(raw[ln.key], b, now)
      else
        avail = ln.a - quota_used(raw[ln.key], (window(b, now, raw[ln.key])))
      end
      local cap = rate_grant(avail, rate, want)
      if tight == nil or cap < tight_cap or (cap == tight_cap and avail < tight_avail) then
        tight, tight_cap, tight_avail = ln, cap, avail
      end
      if cap < grant then
        grant = cap
      end
    end
  end
end

if grant == 0 and want > 0 then
  local ln = tight
  local need = rate_debit(1, ln.rate)
  local retry, reset
  if ln.kind == 'B' then
    local level, last = bucket_stored(raw[ln.key], ln.a, ln.sb, now)
    retry = refill_wait(need * UNITS - level, ln.sa, now, last)
    reset = refill_wait(ln.sb * UNITS - level, ln.sa, now, last)
  elseif ROLL[ln.b] ~= nil then
    local _, e = roll_at(raw[ln.key], ln.b, now)
    retry = roll_wait(e, ln.b, now, need - tight_avail)
    reset = retry
  else
    local _, wend = window(ln.b, now, raw[ln.key])
    retry, reset = wend - now, wend - now
  end
  return { 'X', s(now), s(ln.i - 1), s(tight_avail), s(retry), s(reset) }
end

local live = {}
for _, ln in ipairs(lines) do
  local key, d = ln.key, ln.d
  local amount = 0
  if ln.rate ~= nil and ln.rate > 0 then
    amount = rate_debit(grant, ln.rate)
  end
  if amount > 0 and ln.kind == 'B' then
    local level, last, rate, burst = bucket_stored(raw[key], ln.sa, ln.sb, now)
    -- amount ≤ what every budget has: the floor is never reached.
    level = bucket_debit(level, amount * UNITS)
    local v = pack('<dddd', level, last, rate, burst)
    call('SET', key, v, 'PX', ttl_ms(refill_wait(burst * UNITS - level, rate, now, last)))
    raw[key] = v
    d = s(tonumber(d) + amount)
  elseif amount > 0 and ln.kind == 'Q' then
    local w, v, ttl
    if ROLL[ln.b] ~= nil then
      local total, e = roll_at(raw[key], ln.b, now)
      total, e, w = roll_debit(total, e, ln.b, now, amount)
      v, ttl = pack('<d', total) .. e, ttl_ms(roll_until_empty(e, ln.b, now))
    else
      local wend
      w, wend = window(ln.b, now, raw[key])
      v, ttl = pack('<dd', w, quota_used(raw[key], w) + amount), ttl_ms(wend - now)
    end
    call('SET', key, v, 'PX', ttl)
    raw[key] = v
    if d ~= '' then
      d = d .. ','
    end
    d = d .. s(w) .. ':' .. s(amount)
  end
  live[#live + 1] = fmt('%d %s %s %s %d %s %s;', ln.i, ln.p, ln.kind, ln.ref, ln.a, ln.bs, d)
end
local head = string.gsub(h.head, '^(%d+ )%d+', '%1' .. s(h.res + grant), 1)
local ext = s(now) .. ':' .. s(grant)
if h.ext ~= '' then
  ext = h.ext .. ' ' .. ext
end
call('SET', KEYS[1], '0 ' .. head .. ' 0 0 0\n' .. table.concat(KEYS, ' ', 2) .. '\n'
  .. table.concat(live) .. '\n' .. ext .. '\n' .. string.sub(h.raw, h.rest_at), 'PX', ttl_ms(h.exp - now))
return { 'E', s(now), s(grant) }
