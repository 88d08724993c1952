-- inflight_release.lua: free holder's slot, if it holds. The key's layout:
-- see inflight_acquire.lua. (A holder of weight 1 whose hold is young is
-- released by a plain ZREM instead: see redisstore's Release.)
--
--   KEYS[1]  the ZSET
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  holder id
--   ARGV[3]  how long a tombstone lives, µs; 0 writes none
--   Returns  {1} if holder held and is now released, else {0}: an unknown
--            id frees nothing; an expired holder is left to the next
--            acquire
--
-- A release that finds no live holder leaves a tombstone of its id, until
-- now + ARGV[3], so that its acquire, should it run here later (it timed
-- out, and this is its abandoned release), is refused rather than held
-- for a hold nobody ends. Tombstones whose end has passed go as the next
-- is written; beyond TOMBS live ones, the one ending first goes; the key
-- lives until the last ends. A holder id is secret and used once, so a
-- tombstone refuses no other acquire.

local key = KEYS[1]
local id = ARGV[2]
local TOMB = 4503599627370496 -- 2^52: see inflight_acquire.lua
local TOMBS = 1024
local m = redis.call('ZMSCORE', key, 'h' .. id, 'H' .. id, 'w' .. id, '', 'n', 't', 'X')
local held = tonumber(m[1] or m[2])
local tombs = -(tonumber(m[7]) or 0)
local left = tombs
if tombs > 0 then -- the ended ones go
  left = tombs - redis.call('ZREMRANGEBYSCORE', key, '(4503599627370496', string.format('%d', TOMB + now))
end
if held == nil or held <= now then
  local life = tonumber(ARGV[3])
  if life <= 0 then
    if left == 0 and tombs > 0 then
      redis.call('ZREM', key, 'X')
    elseif left ~= tombs then
      redis.call('ZADD', key, -left, 'X')
    end
    return {0}
  end
  local ends = now + life
  left = left + redis.call('ZADD', key, TOMB + ends, 'x' .. id)
  if left > TOMBS then
    local first = redis.call('ZRANGEBYSCORE', key, '(4503599627370496', '+inf', 'LIMIT', 0, 1)
    redis.call('ZREM', key, first[1])
    left = left - 1
  end
  local z = {-left, 'X'}
  if ends > -(tonumber(m[6]) or 0) then
    z[3], z[4] = -ends, 't'
  end
  redis.call('ZADD', key, unpack(z))
  if z[3] then
    local ttl = ttlms(life)
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  end
  return {0}
end
local extra = -(tonumber(m[4]) or 0)
local inuse = redis.call('ZCARD', key) + extra - left
for i = 4, 7 do
  if m[i] then
    inuse = inuse - 1
  end
end
local last = inuse <= 1
local drop = {'h' .. id}
if m[2] then
  local weight = -tonumber(m[3])
  last = inuse <= weight
  extra = extra - (weight - 2)
  drop = {'H' .. id, 'w' .. id}
  if extra == 0 then
    drop[3] = ''
  elseif not last then
    redis.call('ZADD', key, -extra, '')
  end
end
if last and left == 0 then
  redis.call('DEL', key) -- the last holder
  return {1}
end
if last then -- tombstones stay
  drop[#drop + 1] = 'n'
end
if left == 0 then
  drop[#drop + 1] = 'X'
elseif left ~= tombs then
  redis.call('ZADD', key, -left, 'X')
end
redis.call('ZREM', key, unpack(drop))
return {1}
