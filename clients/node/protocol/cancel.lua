local K = {scheduled = KEYS[1], tasks = KEYS[2], errors = KEYS[3], stats = KEYS[4], attempts = KEYS[5], xkeys = KEYS[6], waits = KEYS[7]}
local A = {id = ARGV[1], finished = ARGV[2]}
local REST = 3
-- cancel: remove a waiting task. A running, finished or dead task is left as it is.
-- KEYS[1] scheduled
-- KEYS[2] tasks
-- KEYS[3] errors
-- KEYS[4] stats
-- KEYS[5] attempts
-- KEYS[6] xkeys
-- KEYS[7] waits
-- ARGV[1] id
-- ARGV[2] finished  the finished channel (protocol 1.1): told if someone waits for the id
-- REPLY cancelled
-- Returns: 1 if the task was waiting and is now gone, else 0.
-- Tell whoever waits for these tasks (queue.wait) that they finished (or were cancelled): each
-- id found in the waits set is published on the finished channel and leaves the set. The
-- message is a JSON array: [id] alone (the waiter reads the task with get), or what get
-- replies of it, [id, state, score, record, error, attempt, result], when message(j) gives
-- that. A queue nobody waits on pays one EXISTS per call. k holds waits.
local function dq_announce(k, channel, ids, message)
  if #ids == 0 or redis.call('EXISTS', k.waits) == 0 then return end
  local until_ = redis.call('ZMSCORE', k.waits, unpack(ids))
  local told, n = {}, 0
  for j = 1, #ids do
    if until_[j] then
      n = n + 1
      told[n] = ids[j]
      local row = message and message(j)
      redis.call('PUBLISH', channel, cjson.encode(row or {ids[j]}))
    end
  end
  if n > 0 then redis.call('ZREM', k.waits, unpack(told)) end
end
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
redis.call('HINCRBY', K.stats, 'cancelled', 1)
if A.finished and A.finished ~= '' then dq_announce(K, A.finished, {A.id}, nil) end
return 1
