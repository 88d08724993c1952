-- inflight_release.lua: free holder's slot, if it holds.
--
--   KEYS     see inflight_prune.lua
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  holder id
--   Returns  {1} if holder held and is now released, else {0}: an unknown
--            id frees nothing

local w = tonumber(redis.call('HGET', hkey, ARGV[2]))
if w then
  redis.call('ZREM', zkey, ARGV[2])
  redis.call('HDEL', hkey, ARGV[2])
  inuse = inuse - w
  reply = {1}
else
  reply = {0}
end
