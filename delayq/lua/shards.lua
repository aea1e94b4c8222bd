-- shards: read, or set once, into how many shards a queue is split.
-- KEYS[1] shards
-- KEYS[2] scheduled
-- KEYS[3] active
-- ARGV[1] want  the shard count this process was opened with
-- Returns: the stored count (1 if none is stored). A count above one is stored only while
-- the unsplit queue has nothing waiting or running, so no task is stranded by a split.
local stored = redis.call('HGET', K.shards, 'n')
if stored then return tonumber(stored) end
if A.want == '1' then return 1 end
if redis.call('ZCARD', K.scheduled) + redis.call('ZCARD', K.active) > 0 then return 1 end
redis.call('HSET', K.shards, 'n', A.want)
return tonumber(A.want)
