-- release: hand leased tasks back without counting the attempt: unrun at shutdown (each
-- keeps its due time, so it runs again promptly), or deferred to a new due time (a watched
-- key whose TTL was extended by other code is re-armed, not fired).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] stats
-- KEYS[5] attempts
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3...] leases  triples: id, lease token, due ("" keeps the task's due time;
--                    "+ms" from now, or absolute ms)
-- REPLY per refused {id}
-- Returns: the ids refused because the lease was lost.
--@include argv
--@include attempt
--@include attempt_text
--@include clock
--@include due
--@include head
--@include lease
--@include requeue
--@include time_text
--@include wake
local now = dq_now(A.now)
local old_head = dq_head(K.scheduled)
local min_due = false
local refused = {}
local n = 0
local ids, tokens, dues = dq_columns(REST, 3)
local held = dq_held(K, ids, tokens, now, true)
for j, id in ipairs(ids) do
  if held[j] then
    local t, a, d = dq_attempt(K, id)
    redis.call('HSET', K.attempts, id, dq_attempt_text(t, math.max(a - 1, 0), d and dq_ms(d) or ''))
    local due = d or now
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
