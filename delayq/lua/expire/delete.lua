-- expire_delete: stop watching a key (step 1 of expiring.delete; step 2 deletes the key).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] errors
-- KEYS[5] stats
-- KEYS[6] xkeys
-- KEYS[7] attempts
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] key        the watched key
-- REPLY cancelled
-- Returns: 1 if a waiting expiry was cancelled, else 0.
-- Only a key that has not expired is cancelled (waiting, or claimed ahead of its deadline:
-- the claim is revoked). An expiry that happened is still delivered, and a mapping stays
-- with its task's record (a bell about the key is then not taken for a foreign key's).
--@include clock
--@include expire
--@include expire_drop
local now = dq_now(A.now)
local id = redis.call('HGET', K.xkeys, A.key)
local state = dq_watch_state(K, id, now)
if state == 'alive' or state == 'ahead' then
  dq_watch_drop(K, id)
  redis.call('HDEL', K.xkeys, A.key)
  redis.call('HINCRBY', K.stats, 'cancelled', 1)
  return 1
end
if id and state == 'none' then redis.call('HDEL', K.xkeys, A.key) end
return 0
