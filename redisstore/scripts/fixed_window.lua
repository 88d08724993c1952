-- fixed_window.lua: units counted per calendar window
-- [w·period, (w+1)·period). Mirrors memory/fixedwindow.go decision for
-- decision.
--
-- State: a HASH {w, n}: the window number and the units taken in it. The
-- window number lives in the value, not the key name, so the script touches
-- only its declared key and the caller's clock can be injected. A denied
-- request adds nothing, so n never passes rate.
--
-- Script: common.lua .. fixed_window.lua .. "return take_one()" (see
-- common.lua).
--   KEYS[1]   the HASH
--   ARGV      now, mode, 3, rate, period, interval, capacity, cost[, at, token]
--   Returns   {allowed, remaining, retry µs, reset µs, now µs, 0}
-- Refund: n -= cost if the window is still the take's (at's) window.

ALG[3] = {
  decide = function(key, now, p, cost, commit)
    local w = fdiv(now, p.period)
    local h = redis.call('HMGET', key, 'w', 'n')
    local count = 0
    if h[1] ~= false or h[2] ~= false then
      if num(h[1], key) == w then
        count = num(h[2], key)
      end
    end
    local stop = (w + 1) * p.period
    local allowed, retry, reset = 0, 0, 0
    if count + cost <= p.rate then
      allowed = 1
      if commit then
        count = count + cost
        redis.call('HSET', key, 'w', fmt(w), 'n', fmt(count))
        expire(key, stop - now)
      end
    else
      retry = stop - now
    end
    if count > 0 then
      reset = stop - now
    end
    return {allowed, p.rate - count, retry, reset, 0}
  end,

  refund = function(key, now, p, cost, at, token)
    local h = redis.call('HMGET', key, 'w', 'n')
    if h[1] == false or num(h[1], key) ~= fdiv(at, p.period) then
      return -- that window is over, and its count with it
    end
    local n = num(h[2], key) - cost
    if n <= 0 then
      redis.call('DEL', key)
    else
      redis.call('HSET', key, 'n', fmt(n)) -- the TTL still ends the window
    end
  end,
}
