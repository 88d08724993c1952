-- common.lua: helpers and entry points shared by every sluice script.
--
-- Go builds one script per algorithm as
--     common.lua .. <algorithm>.lua .. "return take_one()"
-- and the TakeAll script as
--     common.lua .. all six algorithm files .. "return take_all()"
-- so each algorithm is written once, as functions registered in ALG.
--
-- Every quantity is an integer count of units or microseconds. Lua numbers
-- are doubles, exact below 2^53, which sluice.Limit.Validate guarantees.
-- Numbers go to Redis through fmt (tostring would print %.14g and lose
-- digits).
--
-- take_one: one key, one algorithm.
--   KEYS[1]   the key's state (its type is given in the algorithm's file)
--   ARGV[1]   now in µs; "" or "-1" reads the server's TIME
--   ARGV[2]   mode: "take", "peek" (writes nothing) or "refund"
--   ARGV[3]   algorithm number (sluice.Algorithm)
--   ARGV[4]   rate: units per period
--   ARGV[5]   period, µs
--   ARGV[6]   interval, µs per unit (period/rate rounded up)
--   ARGV[7]   capacity: the most units the key holds
--   ARGV[8]   cost: units to take (or give back)
--   ARGV[9]   refund only: the now the take ran at
--   ARGV[10]  refund only: the token the take returned
--   Returns   take/peek: {allowed (1|0), remaining, retry µs, reset µs, now µs, token}
--             refund: {now µs}
--   The token lets a refund find what the take added (sliding_window_log:
--   its last sequence number); other algorithms return 0.
--
-- take_all: all-or-nothing over several keys of one hash slot.
--   KEYS[i]   request i's state
--   ARGV[1]   now, as above
--   ARGV[2+6(i-1) .. 7+6(i-1)]  request i: algorithm, rate, period,
--             interval, capacity, cost
--   Returns   {now µs, {allowed, remaining, retry, reset} per request}
--   Every request is first checked without writing; only if all allow are
--   they all taken. The caller rejects two requests on the same key.

local ALG = {} -- sluice.Algorithm number -> {decide = fn, refund = fn}

-- fdiv is floor(a/b) for integers, b > 0. The double division may round
-- across an integer, so the quotient is corrected by one if needed.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function fmt(x)
  return string.format('%d', x)
end

-- num parses a stored number; anything else is corrupt state, reported as
-- an error rather than silently treated as fresh.
local function num(v, key)
  local n = tonumber(v)
  if n == nil then
    error({err = 'ERR sluice: corrupt state in ' .. key})
  end
  return n
end

local function clock(arg)
  if arg == nil or arg == '' or arg == '-1' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return num(arg, 'ARGV now')
end

-- expire sets the key's TTL to reset µs rounded up to whole milliseconds, so
-- the key outlives its state and expiring it is the same as the state
-- becoming fresh. A state that is already fresh is deleted.
local function expire(key, reset)
  if reset > 0 then
    redis.call('PEXPIRE', key, fmt(fdiv(reset + 999, 1000)))
  else
    redis.call('DEL', key)
  end
end

local function params(i)
  return {
    rate = num(ARGV[i], 'ARGV rate'),
    period = num(ARGV[i + 1], 'ARGV period'),
    interval = num(ARGV[i + 2], 'ARGV interval'),
    capacity = num(ARGV[i + 3], 'ARGV capacity'),
  }
end

local function algorithm(v)
  local a = ALG[tonumber(v)]
  if a == nil then
    error({err = 'ERR sluice: unknown algorithm ' .. tostring(v)})
  end
  return a
end

local function take_one()
  if redis.replicate_commands then
    redis.replicate_commands() -- before Redis 5, needed to write after TIME
  end
  local now = clock(ARGV[1])
  local mode = ARGV[2]
  local alg = algorithm(ARGV[3])
  local p = params(4)
  local cost = num(ARGV[8], 'ARGV cost')
  if mode == 'refund' then
    alg.refund(KEYS[1], now, p, cost, num(ARGV[9], 'ARGV at'), num(ARGV[10], 'ARGV token'))
    return {now}
  end
  if mode ~= 'take' and mode ~= 'peek' then
    error({err = 'ERR sluice: unknown mode ' .. tostring(mode)})
  end
  local r = alg.decide(KEYS[1], now, p, cost, mode == 'take')
  return {r[1], r[2], r[3], r[4], now, r[5]}
end

local function take_all()
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local now = clock(ARGV[1])
  local reqs = {}
  local all = true
  for i = 1, #KEYS do
    local b = 2 + 6 * (i - 1)
    local q = {alg = algorithm(ARGV[b]), p = params(b + 1), cost = num(ARGV[b + 5], 'ARGV cost')}
    q.r = q.alg.decide(KEYS[i], now, q.p, q.cost, false)
    if q.r[1] ~= 1 then
      all = false
    end
    reqs[i] = q
  end
  local out = {now}
  for i, q in ipairs(reqs) do
    local r = q.r
    if all then
      r = q.alg.decide(KEYS[i], now, q.p, q.cost, true)
    end
    out[i + 1] = {r[1], r[2], r[3], r[4]}
  end
  return out
end
