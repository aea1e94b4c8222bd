--@include forget
--@include unwatch

-- Forget, a few per call, the tasks of a finished set (done, aborted) whose dedupe window
-- ended by upto: their set entries, records (or tombstones), results and watched keys'
-- mappings. k holds tasks, attempts, errors, results and xkeys.
local function dq_trim_finished(k, set, upto, limit)
  local old = redis.call('ZRANGEBYSCORE', set, '-inf', upto, 'LIMIT', 0, limit)
  if #old > 0 then
    redis.call('ZREM', set, unpack(old))
    dq_forget(k, old)
    redis.call('HDEL', k.results, unpack(old))
    dq_unwatch(k, old)
  end
end
