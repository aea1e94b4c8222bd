-- expire_delete: stop watching a key (step 1 of expiring.delete; step 2 deletes the key).
-- KEYS[1] scheduled
-- KEYS[2] tasks
-- KEYS[3] errors
-- KEYS[4] stats
-- KEYS[5] xkeys
-- KEYS[6] attempts
-- ARGV[1] key        the watched key
-- Returns: 1 if a waiting expiry was cancelled, else 0.
--@include common
local id = redis.call('HGET', K.xkeys, A.key)
redis.call('HDEL', K.xkeys, A.key)
if id and redis.call('ZREM', K.scheduled, id) == 1 then
  dq_forget(K, {id})
  redis.call('HINCRBY', K.stats, 'cancelled', 1)
  return 1
end
return 0
