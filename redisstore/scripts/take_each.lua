-- take_each.lua: several independent decisions, on keys of one hash slot,
-- in one script run: how a batch of concurrent calls on one server (or one
-- slot) shares the cost of a script call.
--
-- Go builds this script like take_all.lua's: each algorithm file wrapped,
-- unchanged, as ALG[n] = function(KEYS, ARGV) ... end, then this driver.
--
--   KEYS[i]  decision i's key
--   ARGV[7(i-1)+1 .. 7i]  decision i: algorithm (sluice.Algorithm), then
--            the algorithm script's ARGV[1] .. ARGV[6]: now ("" reads the
--            server's TIME, once for the whole run), mode, its two limit
--            parameters, cost, and a refund's token (else 0)
--   Returns  5 integers per decision, flattened into one array: the
--            algorithm script's reply padded with zeros (a refund's {}
--            becomes 0 0 0 0 0), or -1 0 0 0 0 if the decision raised an
--            error. A failed decision stops neither the others nor the run;
--            the caller runs it again on its own to learn the error.
-- Decisions run in order, so two on one key see each other as two calls
-- would.

local time
local out = {}
for i = 1, #KEYS do
  local b = 7 * (i - 1)
  local now = ARGV[b + 2]
  if now == '' then
    if time == nil then
      local t = redis.call('TIME')
      time = t[1] * 1000000 + t[2]
    end
    now = time
  end
  local alg = ALG[tonumber(ARGV[b + 1])]
  local ok, r = false, nil
  if alg then
    ok, r = pcall(alg, {KEYS[i]}, {now, ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7]})
  end
  local o = 5 * (i - 1)
  if ok then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = r[1] or 0, r[2] or 0, r[3] or 0, r[4] or 0, r[5] or 0
  else
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = -1, 0, 0, 0, 0
  end
end
return out
