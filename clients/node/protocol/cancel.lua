local K = {scheduled = KEYS[1], tasks = KEYS[2], errors = KEYS[3], stats = KEYS[4], attempts = KEYS[5], xkeys = KEYS[6], cancelled = KEYS[7], prio = KEYS[8], waits = KEYS[9]}
local A = {id = ARGV[1], now = ARGV[2], dedupe_ms = ARGV[3], trim_limit = ARGV[4], finished = ARGV[5]}
local REST = 6
-- cancel: remove a waiting task. A running, finished or dead task is left as it is. The
-- cancel is remembered for the dedupe window by a tombstone, the id and the time in the
-- cancelled set, with no record: get answers "cancelled", and the id may be scheduled again
-- at once (a schedule finds no record, so takes it for a new id, whatever its version).
-- KEYS[1] scheduled
-- KEYS[2] tasks
-- KEYS[3] errors
-- KEYS[4] stats
-- KEYS[5] attempts
-- KEYS[6] xkeys
-- KEYS[7] cancelled
-- KEYS[8] prio
-- KEYS[9] waits
-- ARGV[1] id
-- ARGV[2] now         ms, or "" for the server's TIME
-- ARGV[3] dedupe_ms   keep the tombstone this long (0: none)
-- ARGV[4] trim_limit  forget at most this many tombstones whose window has passed
-- ARGV[5] finished    the finished channel: told if someone waits for the id
-- REPLY cancelled
-- Returns: 1 if the task was waiting and is now gone, else 0.
-- Tell whoever waits for these tasks (queue.wait) that they finished (or were cancelled): each
-- id found in the waits set is published on the finished channel and leaves the set. The
-- message is a JSON array: [id] alone (the waiter reads the task with get), or what get
-- replies of it, [id, state, score, record, error, attempt, result], when message(j) gives
-- that. A queue nobody waits on pays one ZCARD per call (not EXISTS, which the documented
-- least-privilege ACL user is not granted). k holds waits.
local function dq_announce(k, channel, ids, message)
  if #ids == 0 or redis.call('ZCARD', k.waits) == 0 then return end
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
-- The one clock: the server's TIME in ms, unless the caller passes an explicit "now"
-- (tests run a script as of a given time).
local function dq_now(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Forget tasks: record, attempt state and last error. k holds tasks, attempts and errors.
local function dq_forget(k, ids)
  redis.call('HDEL', k.tasks, unpack(ids))
  redis.call('HDEL', k.attempts, unpack(ids))
  redis.call('HDEL', k.errors, unpack(ids))
end
-- Forget, a few per call, the tombstones of a set (cancelled) whose dedupe window ended by
-- upto: the set's entries only. A tombstone holds no record, and its id may have been
-- scheduled again since: that record is the new task's and stays.
local function dq_trim_tombstones(set, upto, limit)
  local old = redis.call('ZRANGEBYSCORE', set, '-inf', upto, 'LIMIT', 0, limit)
  if #old > 0 then redis.call('ZREM', set, unpack(old)) end
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
-- Called with 1.0's KEYS and ARGV (no cancelled key, no dedupe_ms): no tombstone, as then;
-- without the waits key or the finished channel, nobody is told.
local tombstones = K.cancelled
local now = dq_now(A.now)
local dedupe = tonumber(A.dedupe_ms) or 0
local cancelled = 0
if redis.call('ZREM', K.scheduled, A.id) == 1 then
  dq_forget(K, {A.id})
  dq_unwatch(K, {A.id})
  if K.prio then redis.call('ZREM', K.prio, A.id) end
  redis.call('HINCRBY', K.stats, 'cancelled', 1)
  if tombstones and dedupe > 0 then redis.call('ZADD', tombstones, now, A.id) end
  cancelled = 1
  if K.waits and A.finished and A.finished ~= '' then dq_announce(K, A.finished, {A.id}, nil) end
end
-- Forget tombstones whose dedupe window has passed, a few per call (as abort does its set).
if tombstones then dq_trim_tombstones(tombstones, now - dedupe, tonumber(A.trim_limit) or 0) end
return cancelled
