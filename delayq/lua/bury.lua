-- bury: move leased tasks to the dead set with the reason (fatal error, attempts spent,
-- no handler for the kind, payload that cannot be decoded).
-- KEYS[1] active
-- KEYS[2] tasks
-- KEYS[3] dead
-- KEYS[4] errors
-- KEYS[5] stats
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2...] tasks   triples: id, lease token, reason
-- Returns: the ids refused because the lease was lost.
--@include common
--@include lease
local now = dq_now(A.now)
local refused = {}
for i = REST, #ARGV, 3 do
  local id = ARGV[i]
  if dq_holds(K, id, ARGV[i + 1], now) then
    redis.call('ZREM', K.active, id)
    dq_bury(K, id, now, ARGV[i + 2])
  else
    refused[#refused + 1] = id
  end
end
return refused
