-- reset.lua: a Reset of a key a lease may have been granted from.
--
--   KEYS[1]  the key's state
--   KEYS[2]  its reset mark
--   ARGV[1]  now, µs; "" reads the server's TIME
--   ARGV[2]  how long the mark lives, ms (sluice.ReturnHorizon)
--   Returns  {1} when the key held state, {0} otherwise
-- The mark is the time of the Reset: a return of a grant made at or before
-- it gives nothing back (grant.lua), since the key as it is now was never
-- charged those units. A key without state needs no mark: its last grant's
-- units have all come back, so no return could give anything.

if redis.call('DEL', KEYS[1]) == 0 then
  return {0}
end
redis.call('SET', KEYS[2], now, 'PX', ARGV[2])
return {1}
