-- dead: a page of the dead set, most recent first (read-only).
-- KEYS[1] dead
-- KEYS[2] tasks
-- KEYS[3] errors
-- ARGV[1] offset
-- ARGV[2] limit
-- Returns: flat quadruples: id, time of death (ms), record (or false), reason (or false).
local ids = redis.call('ZREVRANGE', K.dead, tonumber(A.offset),
  tonumber(A.offset) + tonumber(A.limit) - 1, 'WITHSCORES')
local out = {}
for i = 1, #ids, 2 do
  local id = ids[i]
  out[#out + 1] = id
  out[#out + 1] = ids[i + 1]
  out[#out + 1] = redis.call('HGET', K.tasks, id)
  out[#out + 1] = redis.call('HGET', K.errors, id)
end
return out
