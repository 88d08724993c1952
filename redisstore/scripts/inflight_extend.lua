-- inflight_extend.lua: move holder's deadline to now+hold, if it holds.
-- The key's layout: see inflight_acquire.lua.
--
--   KEYS[1]  the ZSET
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  hold, µs
--   ARGV[3]  holder id
--   Returns  {1} if holder held (and now holds until now+hold), else {0}:
--            an expired holder is left to the next acquire

local key = KEYS[1]
local hold = tonumber(ARGV[2])
local member = 'h' .. ARGV[3]
local m = redis.call('ZMSCORE', key, 't', 'n', member, 'H' .. ARGV[3])
local held = tonumber(m[3])
if m[4] then
  held, member = tonumber(m[4]), 'H' .. ARGV[3]
end
if held == nil or held <= now then
  return {0}
end
local deadline = now + hold
local z = {deadline, member}
if deadline < -(tonumber(m[2]) or 0) then
  z[3], z[4] = -deadline, 'n'
end
local raise = deadline > -(tonumber(m[1]) or 0)
if raise then
  z[#z + 1], z[#z + 2] = -(deadline + hold), 't'
end
redis.call('ZADD', key, unpack(z))
if raise then
  local ttl = ttlms(2 * hold)
  redis.call('PEXPIRE', key, string.format('%d', ttl))
end
return {1}
