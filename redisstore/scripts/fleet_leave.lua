-- fleet_leave.lua: a fleet member withdraws its registration, and is
-- listed as withdrawn for ARGV[2] µs, so that the others' next heartbeats
-- (fleet_roster.lua) drop it from their count at once.
-- KEYS[1]: the fleet's sorted set; KEYS[2]: withdrawn members.
-- ARGV[1]: the member; ARGV[2]: how long it stays listed, µs.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local keep = tonumber(ARGV[2])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', now))
redis.call('ZADD', KEYS[2], string.format('%d', now + keep), ARGV[1])
local ms = math.ceil(keep / 1000)
if redis.call('PTTL', KEYS[2]) < ms then
  redis.call('PEXPIRE', KEYS[2], ms)
end
return 1
