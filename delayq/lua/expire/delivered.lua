-- expire_delivered: after a watched key's callback succeeded, shut the key's gate for a while:
-- checking the key made Redis expire it, and the bell that follows must not be taken for a
-- foreign key's expiry. The key's mapping stays with the delivered task's record (it goes
-- when ack trims the record), which covers a bell however late; the gate covers a queue
-- whose dedupe window is 0, where the record goes at once.
-- KEYS[1] *gate      this key's gate (QueueKeys.expire_gate), given per call
-- ARGV[1] gate_ms    how long the gate stays shut
-- REPLY ok
-- Returns: 1.
redis.call('SET', K.gate, '1', 'PX', tonumber(A.gate_ms))
return 1
