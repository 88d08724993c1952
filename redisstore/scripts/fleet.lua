-- fleet.lua: one heartbeat of a fleet member, and the count of members
-- alive. Not an algorithm: fleet.go runs it alone, without now.lua.
-- KEYS[1]: the fleet's sorted set (member -> expiry, µs on the server's
-- clock); one key, so one hash slot.
-- ARGV[1]: the member; ARGV[2]: its TTL in µs.
-- Returns the number of members whose expiry is still ahead.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[1])
-- The set lives as long as its longest registration: never shortened.
local ms = math.ceil(ttl / 1000)
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('PEXPIRE', KEYS[1], ms)
end
return redis.call('ZCARD', KEYS[1])
