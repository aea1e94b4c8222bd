-- Tell whoever waits for these tasks (queue.wait) that they finished (or were cancelled): each
-- id found in the waits set is published on the finished channel and leaves the set. The
-- message is a JSON array: [id] alone (the waiter reads the task with get), or what get
-- replies of it, [id, state, score, record, error, attempt, result], when message(j) gives
-- that. A queue nobody waits on pays one ZCARD per call (not EXISTS, which the documented
-- least-privilege ACL user is not granted). k holds waits.
local function dq_announce(k, channel, ids, message)
  if #ids == 0 or redis.call('ZCARD', k.waits) == 0 then return end
  local until_ = redis.call('ZMSCORE', k.waits, unpack(ids))
  local told, n = {}, 0
  for j = 1, #ids do
    if until_[j] then
      n = n + 1
      told[n] = ids[j]
      local row = message and message(j)
      redis.call('PUBLISH', channel, cjson.encode(row or {ids[j]}))
    end
  end
  if n > 0 then redis.call('ZREM', k.waits, unpack(told)) end
end
