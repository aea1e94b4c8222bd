-- abort: end a task for good, waiting or running. It moves to the aborted set (kept, as a
-- tombstone or with its record, for the dedupe window, like a finished task) and never runs
-- again. A running
-- attempt loses its lease: its worker's result (ack, retry, bury, release) and its next
-- heartbeat are refused, and the worker is told at once on the wake channel to cancel it.
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] aborted
-- KEYS[4] tasks
-- KEYS[5] errors
-- KEYS[6] stats
-- KEYS[7] attempts
-- KEYS[8] xkeys
-- KEYS[9] results
-- KEYS[10] waits
-- KEYS[11] kinds
-- ARGV[1] now         ms, or "" for the server's TIME
-- ARGV[2] dedupe_ms   keep the aborted record this long (0: forget it now)
-- ARGV[3] trim_limit  forget at most this many aborted records whose window has passed
-- ARGV[4] channel     the wake channel: a running task's worker hears "abort <token> <id>"
-- ARGV[5] keep        "1": keep the whole record; else a tombstone takes its place
-- ARGV[6] finished    the finished channel: the id is published there if someone waits
-- ARGV[7] id
-- REPLY status
-- Returns: 1 if the task was waiting, 2 if it was running (its worker is told), 0 if it is
--          neither (finished, dead, already aborted, or unknown): nothing changed.
-- The message starts with a word, so a worker that does not know it reads no due time in
-- it and ignores it (waker.py).
--@include announce
--@include attempt_token
--@include clock
--@include forget
--@include record
--@include tombstone
--@include trim
--@include unwatch
local now = dq_now(A.now)
local dedupe = tonumber(A.dedupe_ms)
local status = 0
if redis.call('ZREM', K.scheduled, A.id) == 1 then
  status = 1
elseif redis.call('ZREM', K.active, A.id) == 1 then
  status = 2
end
if status > 0 then
  local raw = redis.call('HGET', K.attempts, A.id)
  local token = raw and dq_attempt_token(raw)
  if dedupe > 0 then
    redis.call('ZADD', K.aborted, now, A.id)
    if A.keep ~= '1' then
      local h = dq_split(redis.call('HGET', K.tasks, A.id) or '')
      local kind = (h and h.k) or '?'
      redis.call('HSET', K.tasks, A.id, dq_tombstone(K, raw, now, kind, {}))
      redis.call('HDEL', K.attempts, A.id)
      redis.call('HDEL', K.errors, A.id)
    end
    redis.call('HDEL', K.results, A.id)  -- an earlier run's, of the same id
  else
    dq_forget(K, {A.id})
    dq_unwatch(K, {A.id})
  end
  redis.call('HINCRBY', K.stats, 'aborted', 1)
  dq_announce(K, A.finished, {A.id}, nil)
  if status == 2 and token then
    redis.call('PUBLISH', A.channel, 'abort ' .. string.format('%d', token) .. ' ' .. A.id)
  end
end

-- Forget aborted records whose dedupe window has passed, a few per call (ack trims the done
-- set; aborts are rare, so the aborted set is trimmed here, off the workers' path).
dq_trim_finished(K, K.aborted, now - dedupe, tonumber(A.trim_limit))
return status
