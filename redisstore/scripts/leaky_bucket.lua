-- leaky_bucket.lua: the leaky bucket as a meter. Each unit adds one to the
-- level, which drains one per interval; a request fits while
-- level + cost <= capacity. Mirrors memory/leaky_bucket.go decision for
-- decision.
--
-- State: a HASH {level, last}: the level, and the time (µs) of the last
-- whole leak or when the bucket was last found empty.
--
--   KEYS[1]  the HASH
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  mode: "take", "peek" (writes nothing) or "refund"
--   ARGV[3]  interval: µs per unit leaked
--   ARGV[4]  capacity: the most units the bucket holds
--   ARGV[5]  cost: units to add (or take back out)
--   Returns  take, peek: {allowed (1|0), remaining, retry µs, reset µs}
--            refund: {}; leak to now, then level -= cost (an empty bucket
--            is deleted)
--
-- Conventions: see gcra.lua.

local key = KEYS[1]
local interval = tonumber(ARGV[3])
local capacity = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local mode = ARGV[2]

local level, last = loadbucket(key, 0)
if level > capacity then
  level = capacity -- a larger burst wrote it: full at last, draining since
end
if now > last then -- drain the whole units due
  local d = now - last
  local leaked = floordiv(d, interval)
  if leaked >= level then
    level, last = 0, now
  else
    level = level - leaked
    last = last + leaked * interval
  end
end

local allowed, retry = 1, 0
local write = false
if mode == 'refund' then
  level = level - cost
  if level < 0 then
    level = 0
  end
  write = true
elseif level + cost <= capacity then
  if mode == 'take' then
    level = level + cost
    write = true
  end
else
  allowed, retry = 0, last + (level + cost - capacity) * interval - now
end
local reset = 0
if level > 0 then
  reset = last + level * interval - now
end
if write then
  storebucket(key, level, last, reset)
  if mode == 'refund' then
    return {}
  end
end
return {allowed, capacity - level, retry, reset}
