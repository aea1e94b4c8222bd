-- shards: read, or set once, into how many shards a queue is split.
-- KEYS[1] shards
-- KEYS[2] scheduled
-- KEYS[3] active
-- KEYS[4] dead
-- ARGV[1] want   the shard count this process was opened with
-- ARGV[2] store  "1" (a write): store want if no count is stored; "0" (get, cancel,
--                reschedule): only read
-- REPLY count
-- Returns: the stored count; 0 when none is stored and store is "0"; -1 while the queue is
-- being resharded (field "moving", set by operate.reshard), whatever the count. The first
-- process to write to the queue stores its count (one included), so two processes that
-- disagree cannot both go on. A count above one is stored only while the unsplit queue has
-- nothing waiting, running or dead, so no task is stranded by a split; otherwise 1 is stored
-- and returned.
local stored = redis.call('HMGET', K.shards, 'n', 'moving')
if stored[2] then return -1 end
if stored[1] then return tonumber(stored[1]) end
if A.store ~= '1' then return 0 end
local want = A.want
if want ~= '1' then
  local left = redis.call('ZCARD', K.scheduled) + redis.call('ZCARD', K.active)
    + redis.call('ZCARD', K.dead)
  if left > 0 then want = '1' end
end
redis.call('HSET', K.shards, 'n', want)
return tonumber(want)
