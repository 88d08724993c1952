-- inflight_release.lua: free holder's slot, if it holds. The key's layout:
-- see inflight_acquire.lua.
--
--   KEYS[1]  the ZSET
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  holder id
--   Returns  {1} if holder held and is now released, else {0}: an unknown
--            id frees nothing; an expired holder is left to the next
--            acquire

local key = KEYS[1]
local member, wmember = 'h' .. ARGV[2], 'w' .. ARGV[2]
local m = redis.call('ZMSCORE', key, '', member, wmember)
local held = tonumber(m[2])
if held == nil or held <= now then
  return {0}
end
local inuse = -(tonumber(m[1]) or 0) + (tonumber(m[3]) or -1)
if inuse <= 0 then
  redis.call('DEL', key)
else
  redis.call('ZREM', key, member, wmember)
  redis.call('ZADD', key, -inuse, '')
end
return {1}
