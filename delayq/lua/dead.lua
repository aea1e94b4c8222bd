-- dead: a page of the dead set, most recent first (read-only).
-- KEYS[1] dead
-- KEYS[2] tasks
-- KEYS[3] errors
-- KEYS[4] attempts
-- KEYS[5] kinds
-- ARGV[1] offset
-- ARGV[2] limit
-- REPLY per task {id, score, record, error, attempt}
-- Returns: flat quintuples: id, time of death (ms), record (or false), reason (or false),
--          attempt state (or false: see get.lua).
--@include rows
local ids = redis.call('ZREVRANGE', K.dead, tonumber(A.offset),
  tonumber(A.offset) + tonumber(A.limit) - 1, 'WITHSCORES')
return dq_rows(K, ids, 1, #ids - 1, 2)
