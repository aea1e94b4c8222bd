-- retry: put leased tasks back in the scheduled set for a later attempt, with the error.
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] errors
-- KEYS[5] stats
-- KEYS[6] attempts
-- KEYS[7] control
-- KEYS[8] prio
-- KEYS[9] *history   this ten minutes' hash of the dashboard's history (QueueKeys.history)
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] history    ms to keep the history's hash from now (0: keep no history)
-- ARGV[4] lateness   the batch's start lateness: "<bucket>:<count>" pairs (delayq/history.py)
-- ARGV[5...] tasks   quadruples: id, lease token, due ("+ms" from now, or absolute ms), error
-- REPLY per refused {id}
-- Returns: the ids refused because the lease was lost.
-- A task with a priority goes back into the prio index (lib/prio.lua): looked up only when
-- the controls' marker "prio" says the queue has such tasks (one HGET per call).
--@include argv
--@include clock
--@include due
--@include error
--@include head
--@include history
--@include lease
--@include prio_of
--@include prio_put
--@include record
--@include requeue
--@include wake
local now = dq_now(A.now)
local old_head = dq_head(K.scheduled)
local min_due = false
local refused = {}
local n = 0
local ids, tokens, dues, texts = dq_columns(REST, 4)
local heads = dq_held(K, ids, tokens, now, true)
local prio = nil  -- read at the first task requeued
for j, id in ipairs(ids) do
  if heads[j] then
    local due = dq_due(dues[j], now)
    min_due = dq_requeue(K, id, due, min_due)
    dq_set_error(K.errors, id, texts[j])
    if prio == nil then prio = redis.call('HGET', K.control, 'prio') and true or false end
    if prio then
      local rec = redis.call('HGET', K.tasks, id)
      local p = dq_prio_of(rec and dq_split(rec))
      if p then dq_prio_put(K, id, p, due) end
    end
    n = n + 1
  else
    refused[#refused + 1] = id
  end
end
if n > 0 then redis.call('HINCRBY', K.stats, 'retried', n) end
dq_history(K, now, A.history, 'r', n, A.lateness)
dq_wake(A.channel, old_head, min_due)
return refused
