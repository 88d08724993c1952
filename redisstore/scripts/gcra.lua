-- gcra.lua: the generic cell rate algorithm. Mirrors memory/gcra.go
-- decision for decision.
--
-- State: one STRING, the theoretical arrival time (TAT, µs) at which the
-- key is fresh again. Taking n units moves TAT to max(TAT, now) + n·interval,
-- allowed while TAT stays within capacity·interval of now.
--
-- Script: common.lua .. gcra.lua .. "return take_one()" (see common.lua).
--   KEYS[1]   the STRING holding TAT
--   ARGV      now, mode, 0, rate, period, interval, capacity, cost[, at, token]
--   Returns   {allowed, remaining, retry µs, reset µs, now µs, 0}
-- Refund: TAT -= n·interval (exact: interval is fixed per limit).

ALG[0] = {
  decide = function(key, now, p, cost, commit)
    local span = p.capacity * p.interval
    local tat = redis.call('GET', key)
    if tat == false then
      tat = now
    else
      tat = num(tat, key)
      if tat < now then
        tat = now
      end
    end
    local nxt = tat + cost * p.interval
    local allowed, retry = 0, 0
    if nxt - now <= span then
      allowed = 1
      if commit then
        tat = nxt
        redis.call('SET', key, fmt(tat), 'PX', fmt(fdiv(tat - now + 999, 1000)))
      end
    else
      retry = nxt - now - span
    end
    return {allowed, fdiv(now + span - tat, p.interval), retry, tat - now, 0}
  end,

  refund = function(key, now, p, cost, at, token)
    local tat = redis.call('GET', key)
    if tat == false then
      return
    end
    tat = num(tat, key) - cost * p.interval
    if tat > now then
      redis.call('SET', key, fmt(tat), 'PX', fmt(fdiv(tat - now + 999, 1000)))
    else
      redis.call('DEL', key)
    end
  end,
}
