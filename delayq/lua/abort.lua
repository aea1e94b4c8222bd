-- abort: end a task for good, waiting or running. It moves to the aborted set (kept, with
-- its record, for the dedupe window, like a finished task) and never runs again. A running
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
-- ARGV[1] now         ms, or "" for the server's TIME
-- ARGV[2] dedupe_ms   keep the aborted record this long (0: forget it now)
-- ARGV[3] trim_limit  forget at most this many aborted records whose window has passed
-- ARGV[4] channel     the wake channel: a running task's worker hears "abort <token> <id>"
-- ARGV[5] id
-- REPLY status
-- Returns: 1 if the task was waiting, 2 if it was running (its worker is told), 0 if it is
--          neither (finished, dead, already aborted, or unknown): nothing changed.
-- The message starts with a word, so a worker that does not know it reads no due time in
-- it and ignores it (waker.py).
--@include attempt_token
--@include clock
--@include forget
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
  else
    dq_forget(K, {A.id})
    dq_unwatch(K, {A.id})
  end
  redis.call('HINCRBY', K.stats, 'aborted', 1)
  if status == 2 and token then
    redis.call('PUBLISH', A.channel, 'abort ' .. string.format('%d', token) .. ' ' .. A.id)
  end
end

-- Forget aborted records whose dedupe window has passed, a few per call (ack trims the done
-- set; aborts are rare, so the aborted set is trimmed here, off the workers' path).
dq_trim_finished(K, K.aborted, now - dedupe, tonumber(A.trim_limit))
return status
