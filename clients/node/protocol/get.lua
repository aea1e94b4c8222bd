local K = {scheduled = KEYS[1], active = KEYS[2], dead = KEYS[3], done = KEYS[4], tasks = KEYS[5], errors = KEYS[6], attempts = KEYS[7], aborted = KEYS[8], cancelled = KEYS[9], results = KEYS[10], kinds = KEYS[11]}
local A = {id = ARGV[1]}
local REST = 2
-- get: one task's state, score, record (or a finished task's tombstone), last error and
-- result (read-only).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] dead
-- KEYS[4] done
-- KEYS[5] tasks
-- KEYS[6] errors
-- KEYS[7] attempts
-- KEYS[8] aborted
-- KEYS[9] cancelled
-- KEYS[10] results
-- KEYS[11] kinds
-- ARGV[1] id
-- REPLY {state, score, record, error, attempt, result} | nil
-- Returns: {state, score, record, last error or false, attempt state ("<token> <attempt>
--          <due>") or false, result or false} or false when the id is unknown.
--          score: due time (scheduled), lease deadline (active), time of death, finish,
--          abort or cancel. record: a done or aborted task's tombstone ("<attempts> <ms
--          from its last due time to its finish> <kind>", starting with a digit) unless the
--          queue keeps whole records (protocol 1.1). result (protocol 1.1): what a done
--          task's handler returned, JSON text. A task cancelled within the dedupe window, of
--          which only a tombstone is left, is {"cancelled", time of the cancel, "", false,
--          false, false}; a task under its id since then (scheduled again) is answered
--          instead. A 1.0 caller reads the first five alone: they are where they were.
-- Tombstones as scripts reply them (lib/tombstone.lua). k holds kinds.
-- A stored value as scripts reply it: a tombstone with its kind in place of the code; a
-- record (or false) as it is.
local function dq_tombstone_read(k, value)
  if not value or not string.find(value, '^%d') then return value end
  local head, c = string.match(value, '^(%d+ %-?%d* )(%d+)$')
  if not head then return value end
  return head .. (redis.call('HGET', k.kinds, 'c:' .. c) or '?')
end

-- One task as get replies it: {state, score, record (a tombstone with its kind in full),
-- last error or false, attempt state or false, result or false}, or false when the id is
-- unknown. k holds the five state sets, tasks, errors, attempts, results and kinds, and may
-- hold cancelled: a task cancelled within the dedupe window is {"cancelled", time of the
-- cancel, "", false, false, false}.
local function dq_lookup(k, id)
  local rec = redis.call('HGET', k.tasks, id)
  if not rec then
    local cancelled = k.cancelled and redis.call('ZSCORE', k.cancelled, id)
    if cancelled then return {'cancelled', cancelled, '', false, false, false} end
    return false
  end
  rec = dq_tombstone_read(k, rec)
  local err = redis.call('HGET', k.errors, id)
  local attempt = redis.call('HGET', k.attempts, id)
  for _, state in ipairs({'scheduled', 'active', 'dead', 'done', 'aborted'}) do
    local score = redis.call('ZSCORE', k[state], id)
    if score then
      local result = state == 'done' and redis.call('HGET', k.results, id)
      return {state, score, rec, err, attempt, result}
    end
  end
  return false
end
return dq_lookup(K, A.id)
