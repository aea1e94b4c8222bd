-- get: one task's state, score, record and last error (read-only).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] dead
-- KEYS[4] done
-- KEYS[5] tasks
-- KEYS[6] errors
-- KEYS[7] attempts
-- KEYS[8] aborted
-- KEYS[9] cancelled
-- ARGV[1] id
-- REPLY {state, score, record, error, attempt} | nil
-- Returns: {state, score, record, last error or false, attempt state ("<token> <attempt>
--          <due>") or false} or false when the id is unknown.
--          score: due time (scheduled), lease deadline (active), time of death, finish,
--          abort or cancel. A task cancelled within the dedupe window, of which only a
--          tombstone is left, is {"cancelled", time of the cancel, "", false, false}; a task
--          under its id since then (scheduled again) is answered instead.
local rec = redis.call('HGET', K.tasks, A.id)
if not rec then
  local cancelled = K.cancelled and redis.call('ZSCORE', K.cancelled, A.id)
  if cancelled then return {'cancelled', cancelled, '', false, false} end
  return false
end
local err = redis.call('HGET', K.errors, A.id)
local attempt = redis.call('HGET', K.attempts, A.id)
for _, state in ipairs({'scheduled', 'active', 'dead', 'done', 'aborted'}) do
  local score = redis.call('ZSCORE', K[state], A.id)
  if score then return {state, score, rec, err, attempt} end
end
return false
