-- sliding_window_log.lua: every admitted unit is logged; a request is
-- admitted while fewer than rate units fall in (now-period, now]. Mirrors
-- memory/sliding_window_log.go decision for decision.
--
-- State: a ZSET of entries scored by their time in µs (>= 0), one member per
-- unit. Members are sequence numbers from a per-key counter kept in the
-- sentinel member "#", whose score is minus the last number handed out: so
-- members never collide, even within one microsecond or across processes,
-- and score ranges from 0 up never touch the sentinel. A take prunes
-- expired entries; a denied request adds nothing. Memory: O(rate) per key.
--
--   KEYS[1]  the ZSET
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  mode: "take", "peek" (writes nothing) or "refund"
--   ARGV[3]  period, µs
--   ARGV[4]  rate: units per period
--   ARGV[5]  cost: units to take (or give back)
--   ARGV[6]  refund only: the token the take returned
--   Returns  take, peek: {allowed (1|0), remaining, retry µs, reset µs,
--            token: the last sequence number a take added, else 0}
--            refund: {}; removes the members token-cost+1 .. token
--
-- Conventions: see gcra.lua.

local BATCH = 1000 -- members per ZADD/ZREM, well under Lua's unpack limit

local key = KEYS[1]
local period = tonumber(ARGV[3])
local rate = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local mode = ARGV[2]

if mode == 'refund' then
  local token = tonumber(ARGV[6])
  if token < cost then
    return {}
  end
  local s = token - cost + 1
  while s <= token do
    local members = {}
    for m = s, math.min(token, s + BATCH - 1) do
      members[#members + 1] = string.format('%d', m)
    end
    redis.call('ZREM', key, unpack(members))
    s = s + BATCH
  end
  if tonumber(redis.call('ZSCORE', key, '#')) == -token then
    redis.call('ZINCRBY', key, string.format('%d', cost), '#') -- nobody took since: rewind
  end
  local e = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  local newest = tonumber(e[2])
  if newest == nil or newest < 0 then
    redis.call('DEL', key) -- nothing logged: fresh
    return {}
  end
  local reset = newest + period - now
  expire(key, reset)
  return {}
end

local take = mode == 'take'
local threshold = now - period -- entries at or before it have expired
local skip = 0
if threshold >= 0 then
  if take then
    redis.call('ZREMRANGEBYSCORE', key, '0', string.format('%d', threshold))
  else
    skip = redis.call('ZCOUNT', key, '0', string.format('%d', threshold))
  end
end
local count = redis.call('ZCOUNT', key, '(' .. string.format('%d', math.max(threshold, -1)), '+inf')
local allowed, retry, reset, token = 1, 0, 0, 0
if count + cost <= rate then
  if take then
    count = count + cost
    token = -tonumber(redis.call('ZINCRBY', key, string.format('%d', -cost), '#'))
    local score = string.format('%d', now)
    local s = token - cost + 1
    while s <= token do
      local members = {}
      for m = s, math.min(token, s + BATCH - 1) do
        members[#members + 1] = score
        members[#members + 1] = string.format('%d', m)
      end
      redis.call('ZADD', key, unpack(members))
      s = s + BATCH
    end
  end
else
  allowed = 0
  -- The entry that must expire for cost units to fit; rank 0 is the
  -- sentinel.
  local rank = skip + count + cost - rate - 1
  if redis.call('ZSCORE', key, '#') then
    rank = rank + 1
  end
  local e = redis.call('ZRANGE', key, string.format('%d', rank), string.format('%d', rank), 'WITHSCORES')
  local at = tonumber(e[2])
  if at == nil then
    error({err = 'ERR sluice: corrupt state in ' .. key})
  end
  retry = at + period - now
end
if count > 0 then
  local e = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  local newest = tonumber(e[2])
  if newest == nil or newest < 0 or (allowed == 1 and take and newest < now) then
    newest = now
  end
  reset = newest + period - now
end
if take and allowed == 1 then
  expire(key, reset)
end
return {allowed, rate - count, retry, reset, token}
