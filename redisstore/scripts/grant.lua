-- grant.lua: a lease's grant and return, on any algorithm but the sliding
-- window log.
--
-- Go builds one such script per algorithm as
--     <now.lua>
--     local function alg(KEYS, ARGV) <now.lua><the algorithm's file> end
--     <grant.lua>
-- so that a grant is the algorithm's own peek and take, written once.
--
--   KEYS[1]  the key's state
--   KEYS[2]  the key's epoch (reset.lua): a grant reports it, and keeps it
--            for its horizon; a return of a grant of another gives nothing
--            back
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  "grant", "return", or "regrant" (a return, then a grant, at
--            one now: a lease's refill in one call)
--   ARGV[3]  the algorithm's ARGV[3] (a limit parameter)
--   ARGV[4]  the algorithm's ARGV[4] (the other)
--   grant:   ARGV[5] the most units to take; ARGV[6] how long a return may
--            follow it, ms (sluice.ReturnHorizon)
--   return, regrant:
--            ARGV[5] the units unused; ARGV[6] the grant's time, µs (the at
--            it returned); ARGV[7] interval, µs per unit, for the age rule,
--            0 for the window algorithms, which give every unit back into
--            the grant's window and none into a later one; ARGV[8] the
--            grant's epoch
--   regrant: ARGV[9] and ARGV[10], the grant's ARGV[5] and ARGV[6]
--   Returns  grant: {granted, remaining, retry µs (when none granted),
--            reset µs, at, now, epoch}: at is the time the units were charged at
--            (a caller behind the key's window is charged at its start)
--            return: {units given back}: unused less one per interval
--            begun since the grant, at least 0, and at most what the
--            refund let a take have more (0 into a window gone by, or
--            into a fresh key)
--            regrant: the return's reply, then the grant's
-- A grant takes what a peek says is available, and tries once more one
-- unit smaller where the counter's floored estimate and its float
-- comparison disagree by a rounding. Mirrors memory/grant.go.

local keys = {KEYS[1]}
local mode = ARGV[2]
local given -- the return's reply, for a regrant's
if mode ~= 'grant' then
  local n = tonumber(ARGV[5])
  local at = tonumber(ARGV[6])
  local give = 0
  if tonumber(redis.call('GET', KEYS[2]) or '0') == tonumber(ARGV[8]) then
    local interval = tonumber(ARGV[7])
    give = n
    if interval > 0 then
      local age = now - at
      if age < 0 then
        age = 0
      end
      local begun_us = age + interval - 1
      local begun = floordiv(begun_us, interval)
      give = math.max(n - begun, 0)
    end
    if give > 0 then
      -- Report what the key took back: what a take could have more now,
      -- nothing when the grant's window has gone or the key is fresh.
      local before = alg(keys, {now, 'peek', ARGV[3], ARGV[4], 1})[2]
      alg(keys, {now, 'refund', ARGV[3], ARGV[4], give, at})
      local after = alg(keys, {now, 'peek', ARGV[3], ARGV[4], 1})[2]
      give = math.min(give, math.max(after - before, 0))
    end
  end
  if mode == 'return' then
    return {give}
  end
  given = give
end

local n, horizon = ARGV[5], ARGV[6] -- horizon stays a string for SET
if given then
  n, horizon = ARGV[9], ARGV[10]
end
n = tonumber(n)
local peek = alg(keys, {now, 'peek', ARGV[3], ARGV[4], 1})
local k = math.min(n, peek[2])
local epoch = tonumber(redis.call('GET', KEYS[2]) or '0')
local out = {0, peek[2], math.max(peek[3], 1), peek[4], now, now, epoch}
for try = k, math.max(k - 1, 1), -1 do
  local r = alg(keys, {now, 'take', ARGV[3], ARGV[4], try})
  if r[1] == 1 then
    -- The epoch lives at least as long as this grant's return could give
    -- anything: a Reset meanwhile counts on from it, and a return of this
    -- grant then finds another epoch, even if the Reset's limit (reloaded)
    -- has a shorter horizon. Had it lapsed and come back at 0, this grant's
    -- epoch 0 would pass for the new key's.
    if redis.call('PTTL', KEYS[2]) < tonumber(horizon) then
      redis.call('SET', KEYS[2], epoch, 'PX', horizon)
    end
    out = {try, r[2], 0, r[4], r[5] or now, now, epoch}
    break
  end
end
if given then
  table.insert(out, 1, given)
end
return out
