-- inflight_release_once.lua: inflight_release.lua, defined before this as
-- release(KEYS, ARGV), and a record of the release in the same run, so
-- that the same release sent again (its first reply lost, its outcome
-- unknown) is told the slot was released before rather than not held.
--
--   KEYS[1]  the ZSET (inflight_acquire.lua)
--   KEYS[2]  its released holders: a ZSET of holder ids, each scored by
--            the time, µs, until which its release is remembered; in
--            KEYS[1]'s hash slot
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  holder id
--   ARGV[3]  how long a tombstone lives, µs (inflight_release.lua)
--   ARGV[4]  how long to remember a release, µs
--   Returns  {1} released now, {2} released before (the record is
--            renewed), {0} neither: not held, or expired

local rec = KEYS[2]
local member = ARGV[2]
local remember = tonumber(ARGV[4])
local r = release(KEYS, ARGV)[1]
if r == 0 then
  local kept = tonumber(redis.call('ZSCORE', rec, member))
  if kept == nil or kept <= now then
    return {0}
  end
  r = 2
end
-- Forgotten releases go as new ones are written: the key lives as long
-- as its latest record.
redis.call('ZREMRANGEBYSCORE', rec, '-inf', string.format('%d', now))
redis.call('ZADD', rec, string.format('%d', now + remember), member)
local ttl = ttlms(remember)
if redis.call('PTTL', rec) < ttl then
  redis.call('PEXPIRE', rec, string.format('%d', ttl))
end
return {r}
