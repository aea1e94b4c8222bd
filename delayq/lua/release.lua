-- release: hand leased tasks back without counting the attempt: unrun at shutdown (each
-- keeps its due time, so it runs again promptly), or deferred to a new due time (a watched
-- key whose TTL was extended by other code is re-armed, not fired).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] stats
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3...] leases  triples: id, lease token, due ("" keeps the task's due time;
--                    "+ms" from now, or absolute ms)
-- Returns: the ids refused because the lease was lost.
--@include common
--@include lease
local now = dq_now(A.now)
local old_head = dq_head(K.scheduled)
local min_due = false
local refused = {}
local n = 0
local ids, tokens, dues = dq_columns(REST, 3)
local heads, payloads = dq_held(K, ids, tokens, now, true)
for j, id in ipairs(ids) do
  local h, new = heads[j], nil
  if h then
    h.a = math.max(h.a - 1, 0)
    new = dq_join(h, payloads[j])
  end
  if new then
    redis.call('HSET', K.tasks, id, new)
    local due = tonumber(h.d) or now
    if dues[j] ~= '' then due = dq_due(dues[j], now) end
    min_due = dq_requeue(K, id, due, min_due)
    n = n + 1
  else
    refused[#refused + 1] = id
  end
end
if n > 0 then redis.call('HINCRBY', K.stats, 'released', n) end
dq_wake(A.channel, old_head, min_due)
return refused
