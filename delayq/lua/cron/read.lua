-- cron_read: every schedule's metadata and the state of its next occurrence (read-only).
-- KEYS[1] cron
-- KEYS[2] scheduled
-- KEYS[3] active
-- KEYS[4] done
-- KEYS[5] dead
-- KEYS[6] aborted
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] limit      at most this many schedules
-- REPLY {now} then per schedule {name, meta, state, score}
-- Returns: {now, name1, metadata1, state1, score1, name2, ...}; state is the next
--          occurrence's set (scheduled, active, done, dead, aborted) or "" when it is gone, score
--          its score there (-1 when gone).
--@include clock
local now = dq_now(A.now)
local all = redis.call('HGETALL', K.cron)
local out = {now}
local sets = {'scheduled', 'active', 'done', 'dead', 'aborted'}
for i = 1, math.min(#all, 2 * tonumber(A.limit)), 2 do
  local state, score = '', -1
  local ok, m = pcall(cjson.decode, all[i + 1])
  if ok and type(m) == 'table' and type(m.next_id) == 'string' then
    for _, set in ipairs(sets) do
      local s = redis.call('ZSCORE', K[set], m.next_id)
      if s then
        state, score = set, tonumber(s)
        break
      end
    end
  end
  out[#out + 1] = all[i]
  out[#out + 1] = all[i + 1]
  out[#out + 1] = state
  out[#out + 1] = score
end
return out
