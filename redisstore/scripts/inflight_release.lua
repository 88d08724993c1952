-- inflight_release.lua: free holder's slot, if it holds. The key's layout:
-- see inflight_acquire.lua. (A holder of weight 1 whose hold is young is
-- released by a plain ZREM instead: see redisstore's Release.)
--
--   KEYS[1]  the ZSET
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  holder id
--   Returns  {1} if holder held and is now released, else {0}: an unknown
--            id frees nothing; an expired holder is left to the next
--            acquire

local key = KEYS[1]
local id = ARGV[2]
local m = redis.call('ZMSCORE', key, 'h' .. id, 'H' .. id, 'w' .. id, '', 'n', 't')
local held = tonumber(m[1] or m[2])
if held == nil or held <= now then
  return {0}
end
local extra = -(tonumber(m[4]) or 0)
local inuse = redis.call('ZCARD', key) + extra
for i = 4, 6 do
  if m[i] then
    inuse = inuse - 1
  end
end
if not m[2] then
  if inuse <= 1 then
    redis.call('DEL', key) -- the last holder
  else
    redis.call('ZREM', key, 'h' .. id)
  end
  return {1}
end
local weight = -tonumber(m[3])
extra = extra - (weight - 2)
if inuse <= weight then
  redis.call('DEL', key)
elseif extra == 0 then
  redis.call('ZREM', key, 'H' .. id, 'w' .. id, '')
else
  redis.call('ZREM', key, 'H' .. id, 'w' .. id)
  redis.call('ZADD', key, -extra, '')
end
return {1}
