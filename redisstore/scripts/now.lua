-- now.lua: the opening of every script but take_each.lua; scripts.go
-- prepends it. now is ARGV[1] in µs, or the server's TIME when ARGV[1] is
-- "" (so clock skew between application hosts cannot matter).
local now = ARGV[1]
if now == '' then
  if redis.replicate_commands then
    redis.replicate_commands() -- before Redis 5, needed to write after TIME
  end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(now)
end
