-- shards: read, or set once, into how many shards a queue is split.
-- KEYS[1] shards
-- KEYS[2] scheduled
-- KEYS[3] active
-- KEYS[4] dead
-- ARGV[1] want  the shard count this process was opened with
-- Returns: the stored count. The first process to open the queue stores its count (one
-- included), so two processes that disagree cannot both go on. A count above one is stored
-- only while the unsplit queue has nothing waiting, running or dead, so no task is stranded
-- by a split; otherwise 1 is stored and returned.
local stored = redis.call('HGET', K.shards, 'n')
if stored then return tonumber(stored) end
local want = A.want
if want ~= '1' then
  local left = redis.call('ZCARD', K.scheduled) + redis.call('ZCARD', K.active)
    + redis.call('ZCARD', K.dead)
  if left > 0 then want = '1' end
end
redis.call('HSET', K.shards, 'n', want)
return tonumber(want)
