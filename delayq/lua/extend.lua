-- extend: heartbeat; push the lease deadline of tasks still held to now + lease.
-- KEYS[1] active
-- KEYS[2] tasks
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] lease_ms   new lease length from now
-- ARGV[3...] leases  pairs: id, lease token
-- Returns: the ids whose lease was lost; their handlers must stop.
--@include common
--@include lease
local now = dq_now(A.now)
local deadline = now + tonumber(A.lease_ms)
local lost = {}
for i = REST, #ARGV, 2 do
  local id = ARGV[i]
  if dq_holds(K, id, ARGV[i + 1], now) then
    redis.call('ZADD', K.active, 'XX', deadline, id)
  else
    lost[#lost + 1] = id
  end
end
return lost
