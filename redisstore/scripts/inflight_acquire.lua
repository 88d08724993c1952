-- inflight_acquire.lua: acquire a slot of weight for holder if it fits.
--
--   KEYS     see inflight_prune.lua
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  max: the most weight held at once
--   ARGV[3]  hold, µs
--   ARGV[4]  weight, 1..max
--   ARGV[5]  holder id
--   Returns  {allowed (1|0), in use after, retry µs (an estimate; 0 when
--            allowed)}
--
-- A holder already held (a resent acquire) has its deadline refreshed and
-- counts once, with its first weight.

local max = tonumber(ARGV[2])
local deadline = string.format('%d', now + tonumber(ARGV[3]))
local weight = tonumber(ARGV[4])
local holder = ARGV[5]
if redis.call('HEXISTS', hkey, holder) == 1 then
  redis.call('ZADD', zkey, deadline, holder)
  reply = {1, inuse, 0}
elseif inuse + weight <= max then
  redis.call('ZADD', zkey, deadline, holder)
  redis.call('HSET', hkey, holder, string.format('%d', weight))
  inuse = inuse + weight
  reply = {1, inuse, 0}
else
  -- The estimate: the deadline at which the holders expiring first have
  -- freed enough weight.
  local need = inuse + weight - max
  local freed, at, from = 0, nil, 0
  while at == nil do
    local hs = redis.call('ZRANGE', zkey, from, from + 999, 'WITHSCORES')
    if #hs == 0 then
      error({err = 'ERR sluice: corrupt in-flight state in ' .. zkey})
    end
    for i = 1, #hs, 2 do
      freed = freed + (tonumber(redis.call('HGET', hkey, hs[i])) or 0)
      if freed >= need then
        at = tonumber(hs[i + 1])
        break
      end
    end
    from = from + 1000
  end
  reply = {0, inuse, at - now}
end
