-- cron_sync: apply a worker's start-up pass or periodic check to schedules, each change only
-- if the schedule's metadata is still what the worker read (compare and set).
-- KEYS[1] cron
-- KEYS[2] scheduled
-- KEYS[3] tasks
-- KEYS[4] errors
-- KEYS[5] stats
-- KEYS[6] attempts
-- ARGV[1] channel    wake-up channel
-- ARGV[2...] changes  7-tuples: name, expected metadata ("" = none stored), new metadata
--                     ("" = delete), occurrence to cancel if waiting (""), occurrence to
--                     create: id (""), due (absolute ms), record
-- REPLY per change {applied}
-- Returns: per change, 1 if applied, 0 if refused (the metadata changed meanwhile).
--@include cron_cancel
--@include cron_put
local out = {}
for i = REST, #ARGV, 7 do
  local name, expect, meta = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local cancel, id, due, rec = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  if (redis.call('HGET', K.cron, name) or '') ~= expect then
    out[#out + 1] = 0
  else
    if cancel ~= '' then dq_cron_cancel(K, cancel) end
    if id ~= '' then dq_cron_put(K, id, tonumber(due), rec, A.channel) end
    if meta == '' then
      redis.call('HDEL', K.cron, name)
    else
      redis.call('HSET', K.cron, name, meta)
    end
    out[#out + 1] = 1
  end
end
return out
