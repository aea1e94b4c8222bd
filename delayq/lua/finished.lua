-- finished: kind, due time and finish time of the most recently finished tasks (read-only);
-- the dashboard's lateness chart is drawn from these.
-- KEYS[1] done
-- KEYS[2] tasks
-- KEYS[3] attempts
-- ARGV[1] limit      at most this many tasks
-- REPLY per task {kind, due, finished}
-- Returns: flat triples, most recent first: kind ("?" if undecodable), due of the last run
--          (ms, -1 if unknown), finish time (ms). Records already trimmed are skipped.
--@include attempt
--@include record
local done = redis.call('ZREVRANGE', K.done, 0, tonumber(A.limit) - 1, 'WITHSCORES')
local out = {}
for i = 1, #done, 2 do
  local rec = redis.call('HGET', K.tasks, done[i])
  if rec then
    local h = dq_split(rec)
    local _, _, d = dq_attempt(K, done[i])
    out[#out + 1] = (h and h.k) or '?'
    out[#out + 1] = tonumber(d) or -1
    out[#out + 1] = done[i + 1]
  end
end
return out
