--@include attempt_token

-- Fencing, for a batch: the caller holds a task's lease only if the task is active, the
-- lease has not expired, and the token of the task's current claim is the one handed out
-- with this claim. One ZMSCORE and one HMGET of the attempts hash for the whole batch. With
-- consumes (ack, retry, bury, release), an id repeated in the batch is held only the first
-- time, as if the calls ran one by one. k holds active and attempts.
-- Returns, per id: true when the lease is held, else false.
local function dq_held(k, ids, tokens, now, consumes)
  local held, seen = {}, {}
  if #ids == 0 then return held end
  local deadlines = redis.call('ZMSCORE', k.active, unpack(ids))
  local states = redis.call('HMGET', k.attempts, unpack(ids))
  for j = 1, #ids do
    local h = false
    if deadlines[j] and tonumber(deadlines[j]) >= now then
      local t = states[j] and dq_attempt_token(states[j])
      h = t ~= nil and t == tonumber(tokens[j])
      if h and consumes then
        if seen[ids[j]] then h = false end
        seen[ids[j]] = true
      end
    end
    held[j] = h
  end
  return held, states
end
