-- sliding_window_log.lua: every admitted unit is logged; a request is
-- admitted while fewer than rate units fall in (now-period, now]. Mirrors
-- memory/slidinglog.go decision for decision.
--
-- State: a ZSET of entries scored by their time in µs (>= 0), one member per
-- unit. Members are sequence numbers from a per-key counter kept in the
-- sentinel member "#", whose score is minus the last number handed out: so
-- members never collide, even within one microsecond or across processes,
-- and score ranges from 0 up never touch the sentinel. A take prunes
-- expired entries; a denied request adds nothing. Memory: O(rate) per key.
--
-- Script: common.lua .. sliding_window_log.lua .. "return take_one()" (see
-- common.lua).
--   KEYS[1]   the ZSET
--   ARGV      now, mode, 4, rate, period, interval, capacity, cost[, at, token]
--   Returns   {allowed, remaining, retry µs, reset µs, now µs, last sequence
--             number added (take), else 0}
-- Refund: remove the members token-cost+1 .. token that the take added.

local SWL_BATCH = 1000 -- members per ZADD/ZREM, well under Lua's unpack limit

-- swl_members calls cmd on key with the sequence numbers first..last, in
-- batches; with score, each member is preceded by it (ZADD).
local function swl_members(cmd, key, first, last, score)
  local s = first
  while s <= last do
    local args = {}
    for m = s, math.min(last, s + SWL_BATCH - 1) do
      if score then
        args[#args + 1] = score
      end
      args[#args + 1] = fmt(m)
    end
    redis.call(cmd, key, unpack(args))
    s = s + SWL_BATCH
  end
end

-- swl_newest returns the newest entry's time, or nil when there is none.
local function swl_newest(key)
  local e = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  if e[2] == nil then
    return nil
  end
  local t = num(e[2], key)
  if t < 0 then
    return nil -- only the sentinel is left
  end
  return t
end

ALG[4] = {
  decide = function(key, now, p, cost, commit)
    local threshold = now - p.period -- entries at or before it have expired
    local skip = 0
    if threshold >= 0 then
      if commit then
        redis.call('ZREMRANGEBYSCORE', key, '0', fmt(threshold))
      else
        skip = redis.call('ZCOUNT', key, '0', fmt(threshold))
      end
    end
    local count = redis.call('ZCOUNT', key, '(' .. fmt(math.max(threshold, -1)), '+inf')
    local allowed, retry, reset, token = 0, 0, 0, 0
    if count + cost <= p.rate then
      allowed = 1
      if commit then
        count = count + cost
        token = -num(redis.call('ZINCRBY', key, fmt(-cost), '#'), key)
        swl_members('ZADD', key, token - cost + 1, token, fmt(now))
      end
    else
      -- The entry that must expire for cost units to fit; rank 0 is the
      -- sentinel.
      local rank = skip + count + cost - p.rate - 1
      if redis.call('ZSCORE', key, '#') then
        rank = rank + 1
      end
      local e = redis.call('ZRANGE', key, fmt(rank), fmt(rank), 'WITHSCORES')
      if e[2] == nil then
        error({err = 'ERR sluice: corrupt state in ' .. key})
      end
      retry = num(e[2], key) + p.period - now
    end
    if count > 0 then
      local newest = swl_newest(key)
      if newest == nil or (allowed == 1 and commit and newest < now) then
        newest = now
      end
      reset = newest + p.period - now
    end
    if commit and allowed == 1 then
      expire(key, reset)
    end
    return {allowed, p.rate - count, retry, reset, token}
  end,

  refund = function(key, now, p, cost, at, token)
    if token < cost then
      return
    end
    swl_members('ZREM', key, token - cost + 1, token)
    if tonumber(redis.call('ZSCORE', key, '#')) == -token then
      redis.call('ZINCRBY', key, fmt(cost), '#') -- nobody took since: rewind
    end
    local newest = swl_newest(key)
    if newest == nil then
      redis.call('DEL', key) -- nothing logged: fresh
    else
      expire(key, newest + p.period - now)
    end
  end,
}
