-- pause: pause or resume claiming on a shard.
-- KEYS[1] control
-- KEYS[2] scheduled
-- ARGV[1] paused   "1" pauses, "0" resumes
-- ARGV[2] channel  the wake channel: resuming announces the head so idle workers look now
-- REPLY status
-- Returns: 1 when the state changed, 0 when it already was as asked. While paused, claim
-- leases nothing (expired leases are still reaped); running tasks finish and are acked.
--@include head
--@include time_text
if A.paused == '1' then
  return redis.call('HSET', K.control, 'paused', '1')
end
local changed = redis.call('HDEL', K.control, 'paused')
local head = dq_head(K.scheduled)
if changed == 1 and head then redis.call('PUBLISH', A.channel, dq_ms(head)) end
return changed
