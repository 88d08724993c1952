-- inflight_save.lua: closes every in-flight script (see inflight_prune.lua):
-- writes inuse back, sets both keys' TTL to the last deadline (rounded up
-- to a millisecond), or deletes them when nobody holds.
local last = redis.call('ZRANGE', zkey, '-1', '-1', 'WITHSCORES')
if last[2] == nil then
  redis.call('DEL', zkey, hkey)
else
  redis.call('HSET', hkey, '', string.format('%d', inuse))
  local ttl = ttlms(tonumber(last[2]) - now)
  ttl = string.format('%d', ttl)
  redis.call('PEXPIRE', zkey, ttl)
  redis.call('PEXPIRE', hkey, ttl)
end
return reply
