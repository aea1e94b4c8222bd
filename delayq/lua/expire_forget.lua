-- expire_forget: after a watched key's callback succeeded, drop the key's mapping (unless
-- a newer set of the same key replaced it meanwhile) and shut the key's gate for a while:
-- checking the key made Redis expire it, and the bell that follows must not be taken for
-- a foreign key's expiry.
-- KEYS[1] xkeys
-- KEYS[2] *gate      this key's gate (QueueKeys.expire_gate), given per call
-- ARGV[1] key        the watched key
-- ARGV[2] id         the task that fired
-- ARGV[3] gate_ms    how long the gate stays shut
-- Returns: 1 if the mapping was removed.
redis.call('SET', K.gate, '1', 'PX', tonumber(A.gate_ms))
if redis.call('HGET', K.xkeys, A.key) == A.id then
  return redis.call('HDEL', K.xkeys, A.key)
end
return 0
