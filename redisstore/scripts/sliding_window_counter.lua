-- sliding_window_counter.lua: the last period's units estimated as
-- prev·(period-elapsed)/period + cur, where cur counts the current fixed
-- window, prev the one before and elapsed is the time into the current one.
-- The estimate is checked before incrementing, so denials never inflate it.
-- Mirrors memory/slidingcounter.go decision for decision: the estimate is a
-- double computed with exactly the same operations in the same order.
--
-- State: a HASH {w, c, p}: the current window number, its count, and the
-- previous window's count. Constant memory.
--
-- Script: common.lua .. sliding_window_counter.lua .. "return take_one()"
-- (see common.lua).
--   KEYS[1]   the HASH
--   ARGV      now, mode, 5, rate, period, interval, capacity, cost[, at, token]
--   Returns   {allowed, remaining, retry µs, reset µs, now µs, 0}
-- Refund: c -= cost if the window is still the take's (at's); p -= cost if
-- it has moved on by one.

local function swc_estimate(prev, cur, elapsed, period)
  local weight = (period - elapsed) / period
  return prev * weight + cur
end

-- swc_load returns the stored window and counts, or nil when fresh.
local function swc_load(key)
  local h = redis.call('HMGET', key, 'w', 'c', 'p')
  if h[1] == false and h[2] == false and h[3] == false then
    return nil
  end
  return num(h[1], key), num(h[2], key), num(h[3], key)
end

-- swc_retry finds the first instant t at which cost units fit: it solves
-- the estimate for t, then nudges t by single microseconds so that float
-- rounding cannot make it early or late.
local function swc_retry(w, cur, prev, now, p, cost)
  local function fits(t)
    local tw = fdiv(t, p.period)
    local c, pv = cur, prev
    if tw == w then
      -- as is
    elseif tw == w + 1 then
      c, pv = 0, cur
    else
      c, pv = 0, 0
    end
    return swc_estimate(pv, c, t - tw * p.period, p.period) + cost <= p.rate
  end
  local t = 0
  local free = p.rate - cur - cost
  if free >= 0 and prev > 0 then
    local e = math.ceil(p.period - free * p.period / prev)
    t = w * p.period + math.max(e, 0)
  end
  if t == 0 or t >= (w + 1) * p.period then -- not this window: the next one
    local e = 0
    if cur > 0 then
      e = math.ceil(p.period - (p.rate - cost) * p.period / cur)
    end
    t = (w + 1) * p.period + math.min(math.max(e, 0), p.period)
  end
  t = math.max(t, now + 1)
  for _ = 1, 3 do
    if not (t - 1 > now and fits(t - 1)) then
      break
    end
    t = t - 1
  end
  for _ = 1, 3 do
    if fits(t) then
      break
    end
    t = t + 1
  end
  return t
end

local function swc_reset(w, cur, prev, now, p)
  if cur > 0 then
    return (w + 2) * p.period - now
  elseif prev > 0 then
    return (w + 1) * p.period - now
  end
  return 0
end

ALG[5] = {
  decide = function(key, now, p, cost, commit)
    local w = fdiv(now, p.period)
    local cur, prev = 0, 0
    local sw, sc, sp = swc_load(key)
    if sw == w then
      cur, prev = sc, sp
    elseif sw == w - 1 then
      cur, prev = 0, sc
    end
    local elapsed = now - w * p.period
    local allowed, retry = 0, 0
    if swc_estimate(prev, cur, elapsed, p.period) + cost <= p.rate then
      allowed = 1
      if commit then
        cur = cur + cost
        redis.call('HSET', key, 'w', fmt(w), 'c', fmt(cur), 'p', fmt(prev))
        expire(key, swc_reset(w, cur, prev, now, p))
      end
    else
      retry = swc_retry(w, cur, prev, now, p, cost) - now
    end
    local remaining = math.floor(p.rate - swc_estimate(prev, cur, elapsed, p.period))
    return {allowed, remaining, retry, swc_reset(w, cur, prev, now, p), 0}
  end,

  refund = function(key, now, p, cost, at, token)
    local sw, sc, sp = swc_load(key)
    if sw == nil then
      return
    end
    local tw = fdiv(at, p.period)
    if sw == tw then
      sc = math.max(sc - cost, 0)
    elseif sw == tw + 1 then
      sp = math.max(sp - cost, 0)
    else
      return -- the take's window no longer counts
    end
    local reset = swc_reset(sw, sc, sp, now, p)
    if reset <= 0 then
      redis.call('DEL', key)
      return
    end
    redis.call('HSET', key, 'w', fmt(sw), 'c', fmt(sc), 'p', fmt(sp))
    expire(key, reset)
  end,
}
