-- ack: record tasks as done, if the caller still holds their leases.
-- KEYS[1] active
-- KEYS[2] tasks
-- KEYS[3] done
-- KEYS[4] errors
-- KEYS[5] stats
-- KEYS[6] attempts
-- KEYS[7] xkeys
-- KEYS[8] *history   this ten minutes' hash of the dashboard's history (QueueKeys.history)
-- ARGV[1] now         ms, or "" for the server's TIME
-- ARGV[2] dedupe_ms   keep the finished record this long (0: delete it now)
-- ARGV[3] counter     stats counter to add to: "succeeded" or "discarded"
-- ARGV[4] trim_limit  delete at most this many records whose dedupe window has passed
-- ARGV[5] history     ms to keep the history's hash from now (0: keep no history)
-- ARGV[6] lateness    the batch's start lateness: "<bucket>:<count>" pairs (delayq/history.py)
-- ARGV[7...] leases   pairs: id, lease token
-- REPLY per refused {id}
-- Returns: the ids whose ack was refused because the lease was lost (expired or taken over).
--@include argv
--@include clock
--@include forget
--@include history
--@include lease
--@include time_text
--@include trim
--@include unwatch
local now = dq_now(A.now)
local dedupe = tonumber(A.dedupe_ms)
local ids, tokens = dq_columns(REST, 2)
local heads = dq_held(K, ids, tokens, now, true)
local refused, acked, scored, na, nr = {}, {}, {}, 0, 0
local stamp = dq_ms(now)  -- the done set's score, formatted once rather than per task
for j, id in ipairs(ids) do
  if heads[j] then
    na = na + 1
    acked[na] = id
    scored[2 * na - 1] = stamp
    scored[2 * na] = id
  else
    nr = nr + 1
    refused[nr] = id
  end
end
if na > 0 then
  redis.call('ZREM', K.active, unpack(acked))
  if dedupe > 0 then
    redis.call('ZADD', K.done, unpack(scored))
  else
    dq_forget(K, acked)
    dq_unwatch(K, acked)
  end
  redis.call('HINCRBY', K.stats, A.counter, na)
end
dq_history(K, now, A.history, A.counter == 'discarded' and 'd' or 's', na, A.lateness)

-- Forget finished records whose dedupe window has passed, a few per call.
dq_trim_finished(K, K.done, now - dedupe, tonumber(A.trim_limit))
return refused
