-- sliding_window_counter.lua: the last period's units estimated as
-- prev·(period-elapsed)/period + cur, where cur counts the current fixed
-- window, prev the one before and elapsed is the time into the current one.
-- The estimate is checked before incrementing, so denials never inflate it.
-- Mirrors memory/sliding_window_counter.go decision for decision: the
-- estimate is a double computed with exactly the same operations in the
-- same order.
--
-- State: a HASH {w, c, p}: the current window number, its count, and the
-- previous window's count. Constant memory.
--
--   KEYS[1]  the HASH
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  mode: "take", "peek" (writes nothing) or "refund"
--   ARGV[3]  period, µs
--   ARGV[4]  rate: units per period
--   ARGV[5]  cost: units to take (or give back)
--   ARGV[6]  refund only: the token the take returned (its now)
--   Returns  take, peek: {allowed (1|0), remaining, retry µs, reset µs,
--            token: now, µs}
--            refund: {}; c -= cost if the window is still the take's, p -=
--            cost if it has moved on by one
--
-- Conventions: see gcra.lua.

local key = KEYS[1]
local period = tonumber(ARGV[3])
local rate = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local mode = ARGV[2]

local h = redis.call('HMGET', key, 'w', 'c', 'p')
local sw, sc, sp
if h[1] or h[2] or h[3] then
  sw, sc, sp = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
  if sw == nil or sc == nil or sp == nil or not (sw > -9007199254740992 and sw < 9007199254740992) or sw % 1 ~= 0 or not (sc >= 0 and sc < 9007199254740992) or sc % 1 ~= 0 or not (sp >= 0 and sp < 9007199254740992) or sp % 1 ~= 0 then
    error({err = 'ERR sluice: corrupt state in ' .. key})
  end
elseif mode == 'refund' then
  return {}
end

-- w: the window of now (or, refunding, of the take's), never older than
-- the stored one if a lagging clock explains it (else that one is stale:
-- another period wrote it); skew: how far now moved forward to reach it
local w, skew = window(sw, period)

if mode == 'refund' then
  if sw == w then
    sc = math.max(sc - cost, 0)
  elseif sw == w + 1 then
    sp = math.max(sp - cost, 0)
  else
    return {} -- the take's window no longer counts
  end
  local reset = swcreset(sc, sp, sw, period) -- the state's, seen from now
  if reset <= 0 then
    redis.call('DEL', key)
    return {}
  end
  local ttl = ttlms(reset)
  redis.call('HSET', key, 'w', string.format('%d', sw), 'c', string.format('%d', sc), 'p', string.format('%d', sp))
  redis.call('PEXPIRE', key, string.format('%d', ttl))
  return {}
end

local cur, prev = 0, 0
if sw == w then
  cur, prev = sc, sp
elseif sw == w - 1 then
  prev = sc
end
local elapsed = now - w * period
local allowed, retry = 1, 0
if prev * ((period - elapsed) / period) + cur + cost <= rate then
  if mode == 'take' then
    cur = cur + cost
  end
else
  allowed = 0
  -- The first instant t at which cost units fit: solve the estimate for t,
  -- then check that against the float estimate the decisions use, which
  -- never grows with t: when the solution is not the first instant that
  -- fits (a small weighted count can vanish in the sum beside a large
  -- rate), bisect.
  local function fits(t)
    local tw = floordiv(t, period)
    local c, pv = cur, prev
    if tw == w + 1 then
      c, pv = 0, cur
    elseif tw ~= w then
      c, pv = 0, 0
    end
    return pv * ((period - (t - tw * period)) / period) + c + cost <= rate
  end
  local t = 0
  local free = rate - cur - cost
  if free >= 0 and prev > 0 then
    local e = math.ceil(period - free * period / prev)
    t = w * period + math.max(e, 0)
  end
  if t == 0 or t >= (w + 1) * period then -- not this window: the next one
    local e = 0
    if cur > 0 then
      e = math.ceil(period - (rate - cost) * period / cur)
    end
    t = (w + 1) * period + math.min(math.max(e, 0), period)
  end
  t = math.max(t, now + 1)
  for _ = 1, 3 do
    if fits(t) then
      break
    end
    t = t + 1
  end
  if not fits(t) then
    t = (w + 2) * period -- nothing counted is left: cost <= rate fits
  end
  if t - 1 > now and fits(t - 1) then -- fits(now) is false: it was denied
    local lo = now
    while t - lo > 1 do
      local mid = lo + math.floor((t - lo) / 2)
      if fits(mid) then
        t = mid
      else
        lo = mid
      end
    end
  end
  retry = t - now
end
local reset = swcreset(cur, prev, w, period)
if allowed == 1 and mode == 'take' then
  local ttl = ttlms(reset + skew) -- to the end the caller's clock sees, like the memory store
  redis.call('HSET', key, 'w', string.format('%d', w), 'c', string.format('%d', cur), 'p', string.format('%d', prev))
  redis.call('PEXPIRE', key, string.format('%d', ttl))
end
if retry > 0 then
  retry = retry + skew
end
if reset > 0 then
  reset = reset + skew
end
return {allowed, math.floor(rate - (prev * ((period - elapsed) / period) + cur)), retry, reset, now}
