-- token_bucket.lua: whole tokens refilled one per interval. Mirrors
-- memory/tokenbucket.go decision for decision.
--
-- State: a HASH {tokens, last}: whole tokens, and the time (µs) the last
-- whole token arrived or the bucket was last found full. Integers only, so
-- no drift.
--
-- Script: common.lua .. token_bucket.lua .. "return take_one()" (see
-- common.lua).
--   KEYS[1]   the HASH
--   ARGV      now, mode, 1, rate, period, interval, capacity, cost[, at, token]
--   Returns   {allowed, remaining, retry µs, reset µs, now µs, 0}
-- Refund: refill to now, then tokens += n (a full bucket is deleted).

-- tb_load returns the bucket refilled to now.
local function tb_load(key, now, p)
  local h = redis.call('HMGET', key, 'tokens', 'last')
  local tokens, last
  if h[1] == false and h[2] == false then
    tokens, last = p.capacity, now
  else
    tokens, last = num(h[1], key), num(h[2], key)
  end
  if now > last then
    local added = fdiv(now - last, p.interval)
    if tokens + added >= p.capacity then
      tokens, last = p.capacity, now
    else
      tokens = tokens + added
      last = last + added * p.interval
    end
  end
  return tokens, last
end

local function tb_reset(tokens, last, now, p)
  if tokens < p.capacity then
    return last + (p.capacity - tokens) * p.interval - now
  end
  return 0
end

ALG[1] = {
  decide = function(key, now, p, cost, commit)
    local tokens, last = tb_load(key, now, p)
    local allowed, retry = 0, 0
    if tokens >= cost then
      allowed = 1
      if commit then
        tokens = tokens - cost
        redis.call('HSET', key, 'tokens', fmt(tokens), 'last', fmt(last))
        expire(key, tb_reset(tokens, last, now, p))
      end
    else
      retry = last + (cost - tokens) * p.interval - now
    end
    return {allowed, tokens, retry, tb_reset(tokens, last, now, p), 0}
  end,

  refund = function(key, now, p, cost, at, token)
    if redis.call('EXISTS', key) == 0 then
      return
    end
    local tokens, last = tb_load(key, now, p)
    tokens = tokens + cost
    if tokens >= p.capacity then
      redis.call('DEL', key)
      return
    end
    redis.call('HSET', key, 'tokens', fmt(tokens), 'last', fmt(last))
    expire(key, tb_reset(tokens, last, now, p))
  end,
}
