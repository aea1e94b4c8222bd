-- limit: set or clear a shard's share of the queue's rate limit.
-- KEYS[1] control
-- ARGV[1] now          ms, or "" for the server's TIME
-- ARGV[2] rate         tokens per ms for this shard; "" clears the limit
-- ARGV[3] burst        this shard's bucket size (tokens)
-- ARGV[4] limit        the queue-wide limit as set ("100/s"), shown by the admin views
-- ARGV[5] limit_burst  the queue-wide burst
-- REPLY status
-- Returns: 1. A new limit starts with a full bucket.
--@include clock
if A.rate == '' then
  redis.call('HDEL', K.control, 'rate', 'burst', 'tokens', 'ts', 'limit', 'limit_burst')
  return 1
end
redis.call('HSET', K.control, 'rate', A.rate, 'burst', A.burst, 'tokens', A.burst,
  'ts', string.format('%d', dq_now(A.now)), 'limit', A.limit, 'limit_burst', A.limit_burst)
return 1
