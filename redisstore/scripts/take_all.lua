-- take_all.lua: all-or-nothing over several keys of one hash slot.
--
-- Go builds this script as
--     local ALG = {}
--     ALG[0] = function(KEYS, ARGV) <gcra.lua> end
--     ... one such function per algorithm file ...
--     <take_all.lua>
-- so every algorithm is written once: each one-key script runs unchanged as
-- a function of its own KEYS and ARGV.
--
--   KEYS[i]  request i's state
--   ARGV[1]  now, µs; "" reads the server's TIME (once, for every request)
--   ARGV[2+4(i-1) .. 5+4(i-1)]  request i: algorithm (sluice.Algorithm),
--            then the algorithm script's ARGV[3], ARGV[4] and ARGV[5]
--            (its two limit parameters and the cost)
--   Returns  {allowed, remaining, retry µs, reset µs} for each request in
--            turn, flattened into one array
-- Every request is first checked in peek mode, writing nothing; only if all
-- allow are they all taken. The caller rejects two requests on one key.

local reqs = {}
local all = true
for i = 1, #KEYS do
  local b = 2 + 4 * (i - 1)
  local alg = ALG[tonumber(ARGV[b])]
  if alg == nil then
    error({err = 'ERR sluice: unknown algorithm ' .. tostring(ARGV[b])})
  end
  local keys, argv = {KEYS[i]}, {now, 'peek', ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]}
  local r = alg(keys, argv)
  if r[1] ~= 1 then
    all = false
  end
  reqs[i] = {alg, keys, argv, r}
end
local out = {}
for i, q in ipairs(reqs) do
  local r = q[4]
  if all then
    q[3][2] = 'take'
    r = q[1](q[2], q[3])
  end
  for j = 1, 4 do
    out[4 * (i - 1) + j] = r[j]
  end
end
return out
