-- workers: registered workers, most recently seen first (read-only).
-- KEYS[1] workers
-- KEYS[2] workers_seen
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] limit      at most this many
-- REPLY {now} then per worker {id, seen, info}
-- Returns: {now, id1, last_seen1, info1, id2, ...}; info is false if missing.
--@include clock
local now = dq_now(A.now)
local seen = redis.call('ZREVRANGE', K.workers_seen, 0, tonumber(A.limit) - 1, 'WITHSCORES')
local out = {now}
for i = 1, #seen, 2 do
  out[#out + 1] = seen[i]
  out[#out + 1] = seen[i + 1]
  out[#out + 1] = redis.call('HGET', K.workers, seen[i])
end
return out
