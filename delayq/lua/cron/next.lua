-- cron_next: an occurrence is about to run. Check the lease, apply overlap control, and
-- schedule the next occurrence. Only the schedule's current occurrence (the metadata's
-- next_id) schedules a successor, so a schedule is one chain however its runs are retried.
-- KEYS[1] active
-- KEYS[2] scheduled
-- KEYS[3] tasks
-- KEYS[4] stats
-- KEYS[5] cron
-- KEYS[6] attempts
-- ARGV[1] now          ms, or "" for the server's TIME
-- ARGV[2] channel      wake-up channel
-- ARGV[3] name         the schedule
-- ARGV[4] id           the occurrence's task id
-- ARGV[5] token        its lease token
-- ARGV[6] occurrence   its time (ms)
-- ARGV[7] max_running  runs of this schedule allowed at once (0: no limit)
-- ARGV[8] run          "1" to run it, "0" to skip it (catch-up policy; current occurrence only)
-- ARGV[9] reason       why it is skipped
-- ARGV[10] init        the schedule's metadata (JSON) to start from if none is stored
-- ARGV[11...] next     the next occurrence: id, due (absolute ms), record
-- REPLY status
-- Returns: "run", "skip", "busy" (max_running runs are on: try again later; "waiting" when
--          it was already waiting) or "lost" (the lease is gone: expired or taken over).
--@include attempt
--@include clock
--@include cron
--@include cron_put
local now = dq_now(A.now)
local deadline = redis.call('ZSCORE', K.active, A.id)
if not deadline or tonumber(deadline) < now then return 'lost' end
local token = dq_attempt(K, A.id)
if not token or token ~= tonumber(A.token) then return 'lost' end

local m = dq_cron_meta(K.cron, A.name)
if not m then
  m = cjson.decode(A.init)
  m.running = {}
end
-- Runs still holding a live lease count; finished, crashed or reaped ones drop out here.
local running, count = {}, 0
for rid, started in pairs(m.running) do
  if rid ~= A.id then
    local lease = redis.call('ZSCORE', K.active, rid)
    if lease and tonumber(lease) >= now then
      running[rid] = started
      count = count + 1
    end
  end
end
m.running = running
local max_running = tonumber(A.max_running)
if max_running > 0 and count >= max_running then
  local again = m.waiting == A.id
  m.waiting = A.id  -- the outcome of a running one moves it to now
  dq_cron_save(K.cron, A.name, m)
  if again then return 'waiting' end
  return 'busy'
end
if m.waiting == A.id then m.waiting = nil end
local current = m.next_id == nil or m.next_id == A.id
if current and #ARGV >= REST + 2 then
  local due = tonumber(ARGV[REST + 1])
  dq_cron_put(K, ARGV[REST], due, ARGV[REST + 2], A.channel)
  m.next = due
  m.next_id = ARGV[REST]
end
m.parked = nil
if current and A.run == '0' then
  m.skipped = (tonumber(m.skipped) or 0) + 1
  m.last_skip = tonumber(A.occurrence)
  m.skip_reason = A.reason
  dq_cron_save(K.cron, A.name, m)
  return 'skip'
end
running[A.id] = now
m.last = tonumber(A.occurrence)
m.last_id = A.id
m.last_start = now
m.last_status = 'running'
m.last_end = nil
m.last_error = nil
dq_cron_save(K.cron, A.name, m)
return 'run'
