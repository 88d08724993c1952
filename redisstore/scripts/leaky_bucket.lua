-- leaky_bucket.lua: the leaky bucket as a meter. Each unit adds one to the
-- level, which drains one per interval; a request fits while
-- level + cost <= capacity. Mirrors memory/leakybucket.go decision for
-- decision.
--
-- State: a HASH {level, last}: the level, and the time (µs) of the last
-- whole leak or when the bucket was last found empty.
--
-- Script: common.lua .. leaky_bucket.lua .. "return take_one()" (see
-- common.lua).
--   KEYS[1]   the HASH
--   ARGV      now, mode, 2, rate, period, interval, capacity, cost[, at, token]
--   Returns   {allowed, remaining, retry µs, reset µs, now µs, 0}
-- Refund: leak to now, then level -= n (an empty bucket is deleted).

-- lb_load returns the bucket drained to now.
local function lb_load(key, now, p)
  local h = redis.call('HMGET', key, 'level', 'last')
  local level, last
  if h[1] == false and h[2] == false then
    level, last = 0, now
  else
    level, last = num(h[1], key), num(h[2], key)
  end
  if now > last then
    local leaked = fdiv(now - last, p.interval)
    if leaked >= level then
      level, last = 0, now
    else
      level = level - leaked
      last = last + leaked * p.interval
    end
  end
  return level, last
end

local function lb_reset(level, last, now, p)
  if level > 0 then
    return last + level * p.interval - now
  end
  return 0
end

ALG[2] = {
  decide = function(key, now, p, cost, commit)
    local level, last = lb_load(key, now, p)
    local allowed, retry = 0, 0
    if level + cost <= p.capacity then
      allowed = 1
      if commit then
        level = level + cost
        redis.call('HSET', key, 'level', fmt(level), 'last', fmt(last))
        expire(key, lb_reset(level, last, now, p))
      end
    else
      retry = last + (level + cost - p.capacity) * p.interval - now
    end
    return {allowed, p.capacity - level, retry, lb_reset(level, last, now, p), 0}
  end,

  refund = function(key, now, p, cost, at, token)
    if redis.call('EXISTS', key) == 0 then
      return
    end
    local level, last = lb_load(key, now, p)
    level = level - cost
    if level <= 0 then
      redis.call('DEL', key)
      return
    end
    redis.call('HSET', key, 'level', fmt(level), 'last', fmt(last))
    expire(key, lb_reset(level, last, now, p))
  end,
}
