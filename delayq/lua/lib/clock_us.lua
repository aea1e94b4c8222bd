-- dq_now, and the same instant to the microsecond: a worker maps the server's clock onto
-- its own from a claim's reply, and TIME's milliseconds, rounded down, would start its
-- timers up to a millisecond late (half of one on average).
local function dq_now_us(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg), tonumber(arg) * 1000 end
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end
