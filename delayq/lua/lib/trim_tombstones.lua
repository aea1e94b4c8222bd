-- Forget, a few per call, the tombstones of a set (cancelled) whose dedupe window ended by
-- upto: the set's entries only. A tombstone holds no record, and its id may have been
-- scheduled again since: that record is the new task's and stays.
local function dq_trim_tombstones(set, upto, limit)
  local old = redis.call('ZRANGEBYSCORE', set, '-inf', upto, 'LIMIT', 0, limit)
  if #old > 0 then redis.call('ZREM', set, unpack(old)) end
end
