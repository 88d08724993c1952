-- now.lua: the opening of every script but take_each.lua; scripts.go
-- prepends it. now is ARGV[1] in µs, or the server's TIME when ARGV[1] is
-- "" (so clock skew between application hosts cannot matter). Since Redis
-- 5 a script replicates its effects, not itself, so it may write after
-- TIME without asking (redisstore.MinVersion is 7.0).
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(now)
end
