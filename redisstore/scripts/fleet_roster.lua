-- fleet_roster.lua: one heartbeat of a fleet member, as fleet.lua, that
-- names the members alive and those that withdrew (fleet_leave.lua).
-- KEYS[1]: the fleet's sorted set (member -> expiry, µs on the server's
-- clock); KEYS[2]: withdrawn members (member -> until when they are
-- listed); one hash slot.
-- ARGV[1]: the member; ARGV[2]: its TTL in µs.
-- Returns {members alive, members withdrawn and not back}.
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000000 + t[2])
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[1], string.format('%d', tonumber(now) + ttl), ARGV[1])
-- A member that withdrew and came back under its name is alive, not gone.
redis.call('ZREM', KEYS[2], ARGV[1])
-- The set lives as long as its longest registration: never shortened.
local ms = math.ceil(ttl / 1000)
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('PEXPIRE', KEYS[1], ms)
end
return {redis.call('ZRANGE', KEYS[1], 0, -1), redis.call('ZRANGE', KEYS[2], 0, -1)}
