-- cron_outcome: record how occurrences ended, free their overlap slots, and move an
-- occurrence that waits for a slot to now.
-- KEYS[1] cron
-- KEYS[2] scheduled
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] channel    wake-up channel
-- ARGV[3...] outcomes  quadruples: schedule name, occurrence id, status, error ("" if none)
-- REPLY count
-- Returns: the number of schedules updated.
--@include clock
--@include cron
--@include head
--@include wake
local now = dq_now(A.now)
local n = 0
for i = REST, #ARGV, 4 do
  local name, id, status, err = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local m = dq_cron_meta(K.cron, name)
  if m then
    m.running[id] = nil
    if m.last_id == id then
      m.last_status = status
      m.last_end = now
      if err ~= '' then m.last_error = err else m.last_error = nil end
    end
    if m.waiting then
      local due = redis.call('ZSCORE', K.scheduled, m.waiting)
      if due and tonumber(due) > now then
        local old_head = dq_head(K.scheduled)
        redis.call('ZADD', K.scheduled, 'XX', now, m.waiting)
        dq_wake(A.channel, old_head, now)
      end
    end
    dq_cron_save(K.cron, name, m)
    n = n + 1
  end
end
return n
