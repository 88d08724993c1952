-- gcra.lua: the generic cell rate algorithm. Mirrors memory/gcra.go
-- decision for decision.
--
-- State: one STRING, the theoretical arrival time (TAT, µs) at which the
-- key is fresh again. Taking n units moves TAT to max(TAT, now) + n·interval,
-- allowed while TAT stays within span = capacity·interval of now.
--
--   KEYS[1]  the STRING holding TAT
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  mode: "take", "peek" (writes nothing) or "refund"
--   ARGV[3]  interval: µs per unit
--   ARGV[4]  span: capacity × interval, µs
--   ARGV[5]  cost: units to take (or give back)
--   Returns  take, peek: {allowed (1|0), remaining, retry µs, reset µs}
--            refund: {}; TAT -= cost·interval (exact: interval is fixed)
--
-- Conventions of every script (see scripts.go): integers below 2^53, sent
-- to Redis with %d; the key's TTL is the decision's ResetAfter rounded up
-- to a millisecond (ttlms); integer division is floordiv, which corrects
-- the double quotient where it may round across an integer (both are
-- macros, expanded when the scripts are loaded); state that does not parse
-- as what sluice writes (an integer below 2^53, a count at least 0) is an
-- error, never a fresh start or a verdict drawn from it.

local key = KEYS[1]
local interval = tonumber(ARGV[3])
local span = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local mode = ARGV[2]

local tat = redis.call('GET', key)
if tat then
  tat = tonumber(tat)
  -- Only an integer below 2^53 is a TAT sluice wrote: a NaN compares
  -- false with everything and would deny forever, with no retry.
  if tat == nil or not (tat > -9007199254740992 and tat < 9007199254740992) or tat % 1 ~= 0 then
    error({err = 'ERR sluice: corrupt state in ' .. key})
  end
  if tat - now > span + MAX_CLOCK_SKEW_US then
    tat = now -- another span's, not a lagging clock's: as if expired
  end
  if mode == 'refund' then
    tat = tat - cost * interval
  elseif tat < now then
    tat = now
  end
elseif mode == 'refund' then
  return {}
else
  tat = now
end

local allowed, retry = 1, 0
local write = mode == 'refund'
if not write then
  local nxt = tat + cost * interval
  if nxt - now <= span then
    if mode == 'take' then
      tat = nxt
      write = true
    end
  else
    allowed, retry = 0, nxt - now - span
  end
end
if write then
  if tat > now then
    local ttl = ttlms(tat - now)
    redis.call('SET', key, string.format('%d', tat), 'PX', string.format('%d', ttl))
  else
    redis.call('DEL', key)
  end
  if mode == 'refund' then
    return {}
  end
end

local left = now + span - tat
local remaining = floordiv(left, interval)
return {allowed, remaining, retry, tat - now}
