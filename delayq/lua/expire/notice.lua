-- expire_notice: the bell. Redis reported a key expired. A watched key's task that waits for
-- its first attempt is made due now (the key expired before its recorded deadline); one
-- waiting to retry keeps its backoff. A foreign key matching a pattern gets a task of its
-- own, created by one worker only however many heard the bell (the gate).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] stats
-- KEYS[5] xkeys
-- KEYS[6] attempts
-- KEYS[7] *gate      this key's gate (QueueKeys.expire_gate), given per call
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] key        the key that expired
-- ARGV[4] id         task id to use for a foreign key
-- ARGV[5] record     its record ("" when the key matches no pattern: only watched keys count)
-- ARGV[6] gate_ms    how long the gate stays shut
-- REPLY status
-- Returns: 1 a watched key's task was moved to now, 2 a foreign key's task was created, else 0.
--@include clock
--@include expire
--@include head
--@include wake
local now = dq_now(A.now)
local id = redis.call('HGET', K.xkeys, A.key)
local state = dq_watch_state(K, id, now)
if state == 'alive' then
  local old_head = dq_head(K.scheduled)
  redis.call('ZADD', K.scheduled, now, id)
  dq_wake(A.channel, old_head, now)
  return 1
end
-- Any other task of the key (delivered and still remembered, too) means the bell is its own.
if state ~= 'none' then return 0 end
if A.record == '' then return 0 end
if not redis.call('SET', K.gate, '1', 'NX', 'PX', tonumber(A.gate_ms)) then return 0 end
local old_head = dq_head(K.scheduled)
redis.call('HSET', K.tasks, A.id, A.record)
redis.call('ZADD', K.scheduled, now, A.id)
redis.call('HINCRBY', K.stats, 'scheduled', 1)
dq_wake(A.channel, old_head, now)
return 2
