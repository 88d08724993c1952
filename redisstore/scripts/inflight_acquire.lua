-- inflight_acquire.lua: acquire a slot of weight for holder if it fits.
-- Mirrors memory/inflight.go decision for decision.
--
-- A key's in-flight state is one ZSET, read with one ZMSCORE and ZCARD
-- and written with one ZADD, so that an allowed acquire costs about what
-- a take does:
--   'h'..id  a holder of weight 1: its hold deadline, µs; held while
--            now < deadline
--   'H'..id  a holder of a weight above 1: its deadline, as 'h'
--   'w'..id  -(the weight of holder 'H'..id)
--   ''       -(the sum of weight − 2 over the 'H' holders), only when
--            that sum is not zero
--   'n'      -(a time at or before the earliest deadline): until then no
--            holder has expired, so nothing is scanned; none when no
--            holder is left
--   't'      -(the time the key expires at): the latest deadline plus
--            that hold again, so that the TTL is set about once a hold,
--            or the latest tombstone's end if later
--   'x'..id  a tombstone (inflight_release.lua): TOMB + the time, µs, until
--            which an acquire of holder id is refused
--   'X'      -(the number of tombstones), only when there are some
-- The weight held is ZCARD, less those of '', 'n', 't' and 'X' present
-- and the tombstones, plus the sum in '': a holder of weight 1 is one member, one of weight w two
-- members and w − 2 in ''. So a holder of weight 1 can be released by one
-- ZREM of its 'h' member, without a script (redisstore's Release, while
-- its hold is young), which can never take part of a heavier holder of
-- the same id away; a key it leaves without holders expires with its TTL. Deadlines are
-- in (0, TOMB) (now ≥ 0, and below 2^52 µs, past the year 2100), the
-- tombstones above TOMB and every other score at most zero, so the expired
-- holders are the members scored in (0, now]. The key expires
-- after every hold has ended, so a key whose holders all crashed vanishes
-- by itself. Only acquire removes expired holders, and reports their
-- weight: extend and release take an expired holder for gone and leave it
-- to the next acquire. Scores are sent as Lua numbers (%.17g, exact below
-- 2^53).
--
--   KEYS[1]  the ZSET
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  max: the most weight held at once
--   ARGV[3]  hold, µs
--   ARGV[4]  weight, 1..max
--   ARGV[5]  holder id
--   Returns  {allowed (1|0), in use after, retry µs (an estimate; 0 when
--            allowed), weight of the expired holders removed, 1 if holder
--            was added (not held before) else 0}
--
-- A holder already held (a resent acquire) has its deadline refreshed and
-- counts once, with its first weight. An acquire that finds a live
-- tombstone of its holder is refused (retry 0), and removes it: the holder
-- was released before its acquire ran here (an acquire that timed out,
-- delayed on its way, whose abandoned release came first), and nobody
-- waits for this answer or would release what it held.

local key = KEYS[1]
local max = tonumber(ARGV[2])
local hold = tonumber(ARGV[3])
local weight = tonumber(ARGV[4])
local deadline = now + hold
local id = ARGV[5]

local TOMB = 4503599627370496 -- 2^52
local below = '(4503599627370496' -- holders only, as a range's end
local m = redis.call('ZMSCORE', key, '', 't', 'n', 'h' .. id, 'H' .. id, 'X', 'x' .. id)
local extra = -(tonumber(m[1]) or 0)
local was = extra
local tombs = -(tonumber(m[6]) or 0)
local inuse = redis.call('ZCARD', key) + extra - tombs
for i = 1, 3 do
  if m[i] then
    inuse = inuse - 1
  end
end
if m[6] then
  inuse = inuse - 1
end
local last = -(tonumber(m[2]) or 0)
local first = m[3] and -tonumber(m[3])
local held, member = m[4], 'h' .. id
if m[5] then
  held, member = m[5], 'H' .. id
end
local expired = 0
local z = {}
if first and first <= now then
  -- Remove the expired holders, 1000 at a time, with their weights.
  local nows = string.format('%d', now)
  local gone = redis.call('ZRANGEBYSCORE', key, '(0', nows, 'LIMIT', 0, 1000)
  while #gone > 0 do
    local ws = {}
    for i = 1, #gone do
      if string.byte(gone[i]) == 72 then -- 'H'
        ws[#ws + 1] = 'w' .. string.sub(gone[i], 2)
      else
        expired = expired + 1
      end
    end
    if #ws > 0 then
      local v = redis.call('ZMSCORE', key, unpack(ws))
      for i = 1, #ws do
        local w = -tonumber(v[i])
        expired = expired + w
        extra = extra - (w - 2)
        gone[#gone + 1] = ws[i]
      end
    end
    redis.call('ZREM', key, unpack(gone))
    gone = redis.call('ZRANGEBYSCORE', key, '(0', nows, 'LIMIT', 0, 1000)
  end
  inuse = inuse - expired
  first = tonumber(redis.call('ZRANGEBYSCORE', key, '(0', below, 'WITHSCORES', 'LIMIT', 0, 1)[2])
  if first then
    z = {-first, 'n'}
  else
    redis.call('ZREM', key, 'n')
  end
  if held and tonumber(held) <= now then
    held = nil
  end
end

local allowed, retry = 1, 0
local refused = false
if m[7] then -- a tombstone, live or not, is found once
  refused = tonumber(m[7]) - TOMB > now
  tombs = tombs - 1
  if tombs == 0 then
    redis.call('ZREM', key, 'x' .. id, 'X')
  else
    redis.call('ZREM', key, 'x' .. id)
    z[#z + 1], z[#z + 2] = -tombs, 'X'
  end
end
if refused then
  allowed = 0
elseif held or inuse + weight <= max then
  if not held then
    inuse = inuse + weight
    member = 'h' .. id
    if weight > 1 then
      member = 'H' .. id
      z[#z + 1], z[#z + 2] = -weight, 'w' .. id
      extra = extra + weight - 2
    end
  end
  z[#z + 1], z[#z + 2] = deadline, member
  if not first or deadline < first then
    z[#z + 1], z[#z + 2] = -deadline, 'n'
  end
  if deadline > last then
    z[#z + 1], z[#z + 2] = -(deadline + hold), 't'
  end
else
  -- The estimate: the deadline at which the holders expiring first have
  -- freed enough weight.
  allowed = 0
  local need = inuse + weight - max
  local freed, from = 0, 0
  while retry == 0 do
    local hs = redis.call('ZRANGEBYSCORE', key, '(0', below, 'WITHSCORES', 'LIMIT', from, 1000)
    if #hs == 0 then
      error({err = 'ERR sluice: corrupt in-flight state in ' .. key})
    end
    local ws = {}
    for i = 1, #hs, 2 do
      ws[#ws + 1] = 'w' .. string.sub(hs[i], 2) -- none for an 'h' holder
    end
    local v = redis.call('ZMSCORE', key, unpack(ws))
    for i = 1, #v do
      freed = freed - (tonumber(v[i]) or -1)
      if freed >= need then
        retry = tonumber(hs[2 * i]) - now
        break
      end
    end
    from = from + 1000
  end
end
if extra ~= was then
  if extra == 0 then
    redis.call('ZREM', key, '')
  else
    z[#z + 1], z[#z + 2] = -extra, ''
  end
end
if #z > 0 then
  redis.call('ZADD', key, unpack(z))
end
local added = 0
if allowed == 1 then
  if not held then
    added = 1
  end
  if deadline > last then
    local ttl = ttlms(2 * hold)
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  end
end
return {allowed, inuse, retry, expired, added}
