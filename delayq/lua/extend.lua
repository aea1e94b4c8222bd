-- extend: heartbeat; push the lease deadline of tasks still held to now + lease.
-- KEYS[1] active
-- KEYS[2] tasks
-- KEYS[3] workers
-- KEYS[4] workers_seen
-- KEYS[5] attempts
-- KEYS[6] aborted
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] lease_ms   new lease length from now
-- ARGV[3] worker     the worker's id ("" = do not register)
-- ARGV[4] worker_info its registration (JSON)
-- ARGV[5...] leases  pairs: id, lease token
-- REPLY per lost {id, aborted}
-- Returns: per lease lost, its id and 1 if the task was aborted (queue.abort), else 0; their
--          handlers must stop. (Only lost leases cost the aborted look-up.)
--@include argv
--@include clock
--@include lease
--@include register
local now = dq_now(A.now)
dq_register(K, A.worker, A.worker_info, now)
local deadline = now + tonumber(A.lease_ms)
local ids, tokens = dq_columns(REST, 2)
local heads = dq_held(K, ids, tokens, now, false)
local lost, scored = {}, {}
for j, id in ipairs(ids) do
  if heads[j] then
    scored[#scored + 1] = deadline
    scored[#scored + 1] = id
  else
    lost[#lost + 1] = id
  end
end
if #scored > 0 then redis.call('ZADD', K.active, 'XX', unpack(scored)) end
local out = {}
if #lost > 0 then
  local aborted = redis.call('ZMSCORE', K.aborted, unpack(lost))
  for j, id in ipairs(lost) do
    out[2 * j - 1] = id
    out[2 * j] = aborted[j] and 1 or 0
  end
end
return out
