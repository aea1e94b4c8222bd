-- reshard_mark: the shard count's record while operate.reshard moves a queue to another
-- count. While the field "moving" is set, shards.lua answers -1, so every process that
-- checks the count is refused until the move has ended.
-- KEYS[1] shards
-- ARGV[1] action  "read", "begin", "end" or "abort"
-- ARGV[2] move    "<from>><to>", the move this call is about
-- ARGV[3] count   begin: the count the queue must have now (none stored counts as 1);
--                 end: the count to store
-- REPLY {count, moving} | status
-- Returns: read: {stored count or "", move under way or ""}. begin: 1, or 0 when another
--          move is under way or the stored count is not ARGV count (it changed meanwhile);
--          a begin of the move already under way is 1 (it resumes). end: 1, storing the count
--          and clearing the move. abort: 1, clearing the move if it is this one.
local state = redis.call('HMGET', K.shards, 'n', 'moving')
local n, moving = state[1], state[2]
if A.action == 'read' then
  return {n or '', moving or ''}
elseif A.action == 'begin' then
  if moving then
    if moving == A.move then return 1 end
    return 0
  end
  if (n or '1') ~= A.count then return 0 end
  redis.call('HSET', K.shards, 'moving', A.move)
  return 1
elseif A.action == 'end' then
  redis.call('HSET', K.shards, 'n', A.count)
  redis.call('HDEL', K.shards, 'moving')
  return 1
elseif A.action == 'abort' then
  if moving == A.move then redis.call('HDEL', K.shards, 'moving') end
  return 1
end
return redis.error_reply('reshard_mark: unknown action ' .. tostring(A.action))
