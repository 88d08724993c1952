-- fixed_window.lua: units counted per calendar window
-- [w·period, (w+1)·period). Mirrors memory/fixed_window.go decision for
-- decision.
--
-- State: a HASH {w, n}: the window number and the units taken in it. The
-- window number lives in the value, not the key name, so the script touches
-- only its declared key and the caller's clock can be injected. A denied
-- request adds nothing, so n never passes rate. The TTL is set when a
-- window's first take writes w, to the window's end; later takes in that
-- window only HINCRBY n, since the end has not moved.
--
--   KEYS[1]  the HASH
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  mode: "take", "peek" (writes nothing) or "refund"
--   ARGV[3]  period, µs
--   ARGV[4]  rate: units per window
--   ARGV[5]  cost: units to take (or give back)
--   ARGV[6]  refund only: the token the take returned (its now)
--   Returns  take, peek: {allowed (1|0), remaining, retry µs, reset µs,
--            token: now, µs}
--            refund: {}; n -= cost if the window is still the take's
--
-- Conventions: see gcra.lua.

local key = KEYS[1]
local period = tonumber(ARGV[3])
local rate = tonumber(ARGV[4])
local mode = ARGV[2]

local h = redis.call('HMGET', key, 'w', 'n')
local sw = h[1]
if sw or h[2] then
  sw = tonumber(sw)
  if sw == nil or not (sw > -9007199254740992 and sw < 9007199254740992) or sw % 1 ~= 0 then
    error({err = 'ERR sluice: corrupt state in ' .. key})
  end
end

-- w: the window of now (or, refunding, of the take's), never older than
-- the stored one if a lagging clock explains it (else that one is stale:
-- another period wrote it); skew: how far now moved forward to reach it
local w, skew = window(sw, period)

local count = 0
if sw == w then
  count = tonumber(h[2])
  if count == nil or not (count >= 0 and count < 9007199254740992) or count % 1 ~= 0 then
    error({err = 'ERR sluice: corrupt state in ' .. key})
  end
end

if mode == 'refund' then
  if sw == w then
    count = count - tonumber(ARGV[5])
    if count <= 0 then
      redis.call('DEL', key)
    else
      redis.call('HSET', key, 'n', string.format('%d', count)) -- the TTL still ends the window
    end
  end
  return {}
end

local cost = tonumber(ARGV[5])
local left = (w + 1) * period - now -- until the window ends
if count + cost > rate then
  if count > 0 then
    return {0, rate - count, left + skew, left + skew, now}
  end
  return {0, rate - count, left + skew, 0, now}
end
if mode == 'take' then
  if sw == w then
    redis.call('HINCRBY', key, 'n', ARGV[5])
  else
    redis.call('HSET', key, 'w', string.format('%d', w), 'n', ARGV[5])
    local ttl = ttlms(left)
    redis.call('PEXPIRE', key, string.format('%d', ttl))
  end
  count = count + cost
end
if count > 0 then
  return {1, rate - count, 0, left + skew, now}
end
return {1, rate - count, 0, 0, now}
