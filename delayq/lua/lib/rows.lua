-- Rows of tasks as the views read them (page, dead, seek): for each id of a flat
-- ZRANGE ... WITHSCORES reply, walked from `from` to `to` by `step` (2, or -2 for newest
-- first): id, score, record, last error, attempt state (each false when absent).
-- A finished task's tombstone comes with its kind in full (lib/tombstone.lua).
-- k holds tasks, errors, attempts and kinds.
--@include tombstone_read
local function dq_rows(k, pairs, from, to, step)
  local out = {}
  for i = from, to, step do
    local id = pairs[i]
    out[#out + 1] = id
    out[#out + 1] = pairs[i + 1]
    out[#out + 1] = dq_tombstone_read(k, redis.call('HGET', k.tasks, id))
    out[#out + 1] = redis.call('HGET', k.errors, id)
    out[#out + 1] = redis.call('HGET', k.attempts, id)
  end
  return out
end
