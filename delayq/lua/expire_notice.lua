-- expire_notice: the bell. Redis reported a key expired. A watched key's task is made due
-- now (it expired before its recorded deadline); a foreign key matching a pattern gets a
-- task of its own, created by one worker only however many heard the bell (the gate).
-- KEYS[1] scheduled
-- KEYS[2] tasks
-- KEYS[3] stats
-- KEYS[4] xkeys
-- KEYS[5] *gate      this key's gate (QueueKeys.expire_gate), given per call
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] key        the key that expired
-- ARGV[4] id         task id to use for a foreign key
-- ARGV[5] record     its record ("" when the key matches no pattern: only watched keys count)
-- ARGV[6] gate_ms    how long the gate stays shut
-- Returns: 1 a watched key's task was moved to now, 2 a foreign key's task was created, else 0.
--@include common
local now = dq_now(A.now)
local id = redis.call('HGET', K.xkeys, A.key)
if id then
  local due = redis.call('ZSCORE', K.scheduled, id)
  if due and tonumber(due) > now then
    local old_head = dq_head(K.scheduled)
    redis.call('ZADD', K.scheduled, now, id)
    dq_wake(A.channel, old_head, now)
    return 1
  end
  return 0
end
if A.record == '' then return 0 end
if not redis.call('SET', K.gate, '1', 'NX', 'PX', tonumber(A.gate_ms)) then return 0 end
local old_head = dq_head(K.scheduled)
redis.call('HSET', K.tasks, A.id, A.record)
redis.call('ZADD', K.scheduled, now, A.id)
redis.call('HINCRBY', K.stats, 'scheduled', 1)
dq_wake(A.channel, old_head, now)
return 2
