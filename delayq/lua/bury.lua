-- bury: move leased tasks to the dead set with the reason (fatal error, attempts spent,
-- no handler for the kind, payload that cannot be decoded).
-- KEYS[1] active
-- KEYS[2] tasks
-- KEYS[3] dead
-- KEYS[4] errors
-- KEYS[5] stats
-- KEYS[6] attempts
-- KEYS[7] *history   this ten minutes' hash of the dashboard's history (QueueKeys.history)
-- KEYS[8] waits
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] history    ms to keep the history's hash from now (0: keep no history)
-- ARGV[3] lateness   the batch's start lateness: "<bucket>:<count>" pairs (delayq/history.py)
-- ARGV[4] finished   the finished channel: ids someone waits for are published there
-- ARGV[5...] tasks   triples: id, lease token, reason
-- REPLY per refused {id}
-- Returns: the ids refused because the lease was lost.
--@include announce
--@include argv
--@include bury
--@include clock
--@include history
--@include lease
local now = dq_now(A.now)
local refused, buried = {}, {}
local ids, tokens, reasons = dq_columns(REST, 3)
local heads = dq_held(K, ids, tokens, now, true)
for j, id in ipairs(ids) do
  if heads[j] then
    redis.call('ZREM', K.active, id)
    dq_bury(K, id, now, reasons[j])
    buried[#buried + 1] = id
  else
    refused[#refused + 1] = id
  end
end
dq_announce(K, A.finished, buried, nil)
dq_history(K, now, A.history, 'x', #buried, A.lateness)
return refused
