-- page: a page of the waiting or running tasks, in order of their scores (read-only).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] errors
-- KEYS[5] attempts
-- KEYS[6] kinds
-- ARGV[1] state      "scheduled" (by due time) or "active" (by lease deadline)
-- ARGV[2] offset
-- ARGV[3] limit
-- REPLY per task {id, score, record, error, attempt}
-- Returns: flat quintuples: id, score (ms), record (or false), last error (or false),
--          attempt state (or false: see get.lua).
--@include rows
local set = K.scheduled
if A.state == 'active' then set = K.active end
local ids = redis.call('ZRANGE', set, tonumber(A.offset),
  tonumber(A.offset) + tonumber(A.limit) - 1, 'WITHSCORES')
return dq_rows(K, ids, 1, #ids - 1, 2)
