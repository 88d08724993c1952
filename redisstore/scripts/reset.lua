-- reset.lua: a Reset of a key a lease may have been granted from.
--
--   KEYS[1]  the key's state
--   KEYS[2]  its epoch: how many times it was Reset, lately
--   ARGV[1]  now, µs; "" reads the server's TIME (unused: every script
--            opens with the clock)
--   ARGV[2]  how long the epoch lives at least, ms (sluice.ReturnHorizon)
--   Returns  {1} when the key held state, {0} otherwise
-- A new epoch starts: a return of a grant made in another gives nothing
-- back (grant.lua), since the key as it is now was never charged those
-- units. A key without state needs none: its last grant's units have all
-- come back, so no return could give anything.

if redis.call('DEL', KEYS[1]) == 0 then
  return {0}
end
-- INCR keeps the TTL a grant gave the epoch (as long as that grant's
-- return could give anything, under the grant's own limit, which a reload
-- may since have changed); the Reset's own limit may ask longer.
redis.call('INCR', KEYS[2])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return {1}
