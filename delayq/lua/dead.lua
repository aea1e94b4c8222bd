-- dead: a page of the dead set, most recent first (read-only).
-- KEYS[1] dead
-- KEYS[2] tasks
-- KEYS[3] errors
-- KEYS[4] attempts
-- ARGV[1] offset
-- ARGV[2] limit
-- Returns: flat quintuples: id, time of death (ms), record (or false), reason (or false),
--          attempt state (or false: see get.lua).
local ids = redis.call('ZREVRANGE', K.dead, tonumber(A.offset),
  tonumber(A.offset) + tonumber(A.limit) - 1, 'WITHSCORES')
local out = {}
for i = 1, #ids, 2 do
  local id = ids[i]
  out[#out + 1] = id
  out[#out + 1] = ids[i + 1]
  out[#out + 1] = redis.call('HGET', K.tasks, id)
  out[#out + 1] = redis.call('HGET', K.errors, id)
  out[#out + 1] = redis.call('HGET', K.attempts, id)
end
return out
