-- finished: kind, due time and finish time of the most recently finished tasks (read-only);
-- the dashboard's lateness chart is drawn from these.
-- KEYS[1] done
-- KEYS[2] tasks
-- KEYS[3] attempts
-- KEYS[4] kinds
-- ARGV[1] limit      at most this many tasks
-- REPLY per task {kind, due, finished}
-- Returns: flat triples, most recent first: kind ("?" if undecodable), due of the last run
--          (ms, -1 if unknown), finish time (ms). Records already trimmed are skipped.
--@include attempt
--@include record
local done = redis.call('ZREVRANGE', K.done, 0, tonumber(A.limit) - 1, 'WITHSCORES')
local out = {}
local kinds = {}  -- tombstones' codes read so far
for i = 1, #done, 2 do
  local rec = redis.call('HGET', K.tasks, done[i])
  if rec then
    local kind, d
    local lag, c = string.match(rec, '^%d+ (%-?%d*) (%d+)$')
    if c then  -- a tombstone (lib/tombstone.lua)
      kinds[c] = kinds[c] or redis.call('HGET', K.kinds, 'c:' .. c) or '?'
      kind = kinds[c]
      d = tonumber(lag) and tonumber(done[i + 1]) - tonumber(lag)
    else
      local h = dq_split(rec)
      local _, _, due = dq_attempt(K, done[i])
      kind, d = (h and h.k) or '?', due
    end
    out[#out + 1] = kind
    out[#out + 1] = tonumber(d) or -1
    out[#out + 1] = done[i + 1]
  end
end
return out
