local K = {scheduled = KEYS[1], tasks = KEYS[2], errors = KEYS[3], stats = KEYS[4], attempts = KEYS[5], xkeys = KEYS[6], prio = KEYS[7]}
local A = {id = ARGV[1]}
local REST = 2
-- cancel: remove a waiting task. A running, finished or dead task is left as it is.
-- KEYS[1] scheduled
-- KEYS[2] tasks
-- KEYS[3] errors
-- KEYS[4] stats
-- KEYS[5] attempts
-- KEYS[6] xkeys
-- KEYS[7] prio
-- ARGV[1] id
-- REPLY cancelled
-- Returns: 1 if the task was waiting and is now gone, else 0.
-- Forget tasks: record, attempt state and last error. k holds tasks, attempts and errors.
local function dq_forget(k, ids)
  redis.call('HDEL', k.tasks, unpack(ids))
  redis.call('HDEL', k.attempts, unpack(ids))
  redis.call('HDEL', k.errors, unpack(ids))
end
-- A watched key's mapping goes with its task's record: called where records are forgotten
-- (ack's trimming, cancel, purge). Ids of other tasks are skipped. k holds xkeys.
local function dq_unwatch(k, ids)
  for _, id in ipairs(ids) do
    if string.sub(id, 1, 2) == 'x:' then
      local key = string.match(id, '^x:[^:]*:(.*)$')
      if key and redis.call('HGET', k.xkeys, key) == id then
        redis.call('HDEL', k.xkeys, key)
      end
    end
  end
end
if redis.call('ZREM', K.scheduled, A.id) == 0 then return 0 end
dq_forget(K, {A.id})
dq_unwatch(K, {A.id})
redis.call('ZREM', K.prio, A.id)
redis.call('HINCRBY', K.stats, 'cancelled', 1)
return 1
