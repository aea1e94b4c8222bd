-- handback: hand back leased tasks of a kind the worker has no handler for, without
-- counting the attempt, until unknown_kind_grace has passed since they fell due; then bury
-- them with the reason (no attempt counted either: no handler ran). Since when: the due
-- time of the claim that first met the kind, kept in the task's last error ("unknown kind
-- since <ms>: ..."), so every worker of the queue counts from the same instant, on the
-- server's clock. Each hand-back waits as long as has passed since then, between first_ms
-- and most_ms (a backoff that doubles), so a kind no worker handles costs a few claims an
-- hour, not one a poll.
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] dead
-- KEYS[5] errors
-- KEYS[6] stats
-- KEYS[7] attempts
-- KEYS[8] waits
-- KEYS[9] *history   this ten minutes' hash of the dashboard's history (QueueKeys.history)
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3] grace_ms   how long since the task fell due it is handed back before it is buried
-- ARGV[4] first_ms   the first hand-back's wait
-- ARGV[5] most_ms    the longest wait
-- ARGV[6] finished   the finished channel: buried ids someone waits for are published there
-- ARGV[7] history    ms to keep the history's hash from now (0: keep no history); a burial
--                    counts as dead there, as bury's do
-- ARGV[8] lateness   "" (no handler started)
-- ARGV[9...] tasks   triples: id, lease token, reason (no handler for its kind here)
-- REPLY per task {id, status, waited}
-- Returns: per task its id, its status (0: refused, the lease was lost; 1: handed back;
--          2: buried) and waited (ms since it first fell due with no handler; 0 if refused).
--@include announce
--@include argv
--@include attempt
--@include attempt_text
--@include bury
--@include clock
--@include error
--@include head
--@include history
--@include lease
--@include requeue
--@include time_text
--@include wake
local now = dq_now(A.now)
local grace = tonumber(A.grace_ms)
local first, most = tonumber(A.first_ms), tonumber(A.most_ms)
local old_head = dq_head(K.scheduled)
local min_due = false
local out, buried = {}, {}
local n = 0
local ids, tokens, reasons = dq_columns(REST, 3)
local held = dq_held(K, ids, tokens, now, true)
for j, id in ipairs(ids) do
  local status, waited = 0, 0
  if held[j] then
    local t, a, d = dq_attempt(K, id)
    local last = redis.call('HGET', K.errors, id)
    local since = last and tonumber(string.match(last, '^unknown kind since (%d+): '))
    if not since then since = d or now end
    -- Another program's due time may be anything: NaN or before 1970 is long due.
    if since ~= since or since < 0 then since = 0 end
    since = math.floor(math.min(since, now))
    waited = now - since
    -- Not an attempt either way: no handler ran.
    redis.call('HSET', K.attempts, id, dq_attempt_text(t, math.max(a - 1, 0), d and dq_ms(d) or ''))
    if waited >= grace then
      redis.call('ZREM', K.active, id)
      dq_bury(K, id, now, string.format(
        '%s; handed back for %d s since it fell due, and unknown_kind_grace is %d s',
        reasons[j], math.floor(waited / 1000), math.floor(grace / 1000)))
      buried[#buried + 1] = id
      status = 2
    else
      local wait = math.min(math.max(waited, first), most)
      min_due = dq_requeue(K, id, now + wait, min_due)
      dq_set_error(K.errors, id, 'unknown kind since ' .. string.format('%d', since) .. ': ' .. reasons[j])
      n = n + 1
      status = 1
    end
  end
  out[#out + 1] = id
  out[#out + 1] = status
  out[#out + 1] = waited
end
if n > 0 then redis.call('HINCRBY', K.stats, 'unknown_kind', n) end
dq_history(K, now, A.history, 'x', #buried, A.lateness)
dq_wake(A.channel, old_head, min_due)
dq_announce(K, A.finished, buried, nil)
return out
