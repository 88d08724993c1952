-- token_bucket.lua: whole tokens refilled one per interval. Mirrors
-- memory/token_bucket.go decision for decision.
--
-- State: a HASH {tokens, last}: whole tokens, and the time (µs) the last
-- whole token arrived or the bucket was last found full. Integers only, so
-- no drift.
--
--   KEYS[1]  the HASH
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  mode: "take", "peek" (writes nothing) or "refund"
--   ARGV[3]  interval: µs per token
--   ARGV[4]  capacity: the most tokens the bucket holds
--   ARGV[5]  cost: tokens to take (or give back)
--   Returns  take, peek: {allowed (1|0), remaining, retry µs, reset µs}
--            refund: {}; refill to now, then tokens += cost (a full bucket
--            is deleted)
--
-- Conventions: see gcra.lua.

local key = KEYS[1]
local interval = tonumber(ARGV[3])
local capacity = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local mode = ARGV[2]

local tokens, last = loadbucket(key, capacity)
if tokens > capacity then
  tokens = capacity -- a larger burst wrote it
end
if now > last then -- refill the whole tokens due
  local d = now - last
  local added = floordiv(d, interval)
  if tokens + added >= capacity then
    tokens, last = capacity, now
  else
    tokens = tokens + added
    last = last + added * interval
  end
end

local allowed, retry = 1, 0
local write = false
if mode == 'refund' then
  tokens = tokens + cost
  write = true
elseif tokens >= cost then
  if mode == 'take' then
    tokens = tokens - cost
    write = true
  end
else
  allowed, retry = 0, last + (cost - tokens) * interval - now
end
local reset = 0
if tokens < capacity then
  reset = last + (capacity - tokens) * interval - now
end
if write then
  storebucket(key, tokens, last, reset)
  if mode == 'refund' then
    return {}
  end
end
return {allowed, tokens, retry, reset}
