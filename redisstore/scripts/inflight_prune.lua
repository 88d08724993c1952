-- inflight_prune.lua: opens every in-flight script, after now.lua; the
-- script's own body follows, then inflight_save.lua. Mirrors
-- memory/inflight.go decision for decision.
--
-- State of one key, in one hash slot:
--   KEYS[1]  ZSET: holder id -> hold deadline, µs; held while now < deadline
--   KEYS[2]  HASH: holder id -> weight; field "" -> the holders' total
--            weight (holder ids are never empty)
-- Both keys expire at the last deadline, so a key whose holders all crashed
-- vanishes by itself; before anything is counted, the holders whose
-- deadline is at or before now are removed.
--
-- Redis expires the two keys one at a time: should only one be left, every
-- deadline has passed (the TTL is the last one), so the key is fresh.
--
-- Sets for the body: zkey, hkey, nows (now formatted), inuse; the body sets
-- reply, which inflight_save.lua returns after writing inuse back.

local zkey, hkey = KEYS[1], KEYS[2]
local nows = string.format('%d', now)
if redis.call('EXISTS', zkey, hkey) == 1 then
  redis.call('DEL', zkey, hkey)
end
local inuse = tonumber(redis.call('HGET', hkey, '')) or 0
while true do
  local gone = redis.call('ZRANGEBYSCORE', zkey, '-inf', nows, 'LIMIT', 0, 1000)
  if #gone == 0 then
    break
  end
  local ws = redis.call('HMGET', hkey, unpack(gone))
  for i = 1, #gone do
    inuse = inuse - (tonumber(ws[i]) or 0)
  end
  redis.call('ZREM', zkey, unpack(gone))
  redis.call('HDEL', hkey, unpack(gone))
end
local reply
