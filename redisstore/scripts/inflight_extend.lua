-- inflight_extend.lua: move holder's deadline to now+hold, if it holds.
--
--   KEYS     see inflight_prune.lua
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  hold, µs
--   ARGV[3]  holder id
--   Returns  {1} if holder held (and now holds until now+hold), else {0}

if redis.call('HEXISTS', hkey, ARGV[3]) == 1 then
  redis.call('ZADD', zkey, string.format('%d', now + tonumber(ARGV[2])), ARGV[3])
  reply = {1}
else
  reply = {0}
end
