--@include tombstone_read

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
