--@include prio

-- Claim's side of priorities (lib/prio.lua).

-- Claim's look at the index: at most want tasks due by horizon (by the scheduled set),
-- the highest level first, each level in due order. Returns their ids and their {id, due}
-- pairs (as ZRANGEBYSCORE WITHSCORES gives them), with a set of the ids. An entry that
-- disagrees with the scheduled set is repaired as it is met: a task no longer waiting is
-- dropped, one due after horizon is moved to its due time (a 1.0 reschedule moved it).
local function dq_prio_due(k, horizon, want)
  local ids, due, taken, n = {}, {}, {}, 0
  for p = 9, 1, -1 do
    local base = dq_prio_score(p, 0)
    local more = n < want
    while more do
      local ask = want - n
      local rows = redis.call('ZRANGEBYSCORE', k.prio, base, base + horizon, 'LIMIT', 0, ask)
      if #rows == 0 then break end
      local scores = redis.call('ZMSCORE', k.scheduled, unpack(rows))
      local gone, moved, ng, nm = {}, {}, 0, 0
      for j, id in ipairs(rows) do
        local s = scores[j] and tonumber(scores[j])
        if not s then
          ng = ng + 1
          gone[ng] = id
        elseif s > horizon then
          moved[nm + 1], moved[nm + 2] = dq_prio_score(p, s), id
          nm = nm + 2
        else
          n = n + 1
          ids[n], due[2 * n - 1], due[2 * n], taken[id] = id, id, scores[j], true
        end
      end
      if ng > 0 then redis.call('ZREM', k.prio, unpack(gone)) end
      if nm > 0 then redis.call('ZADD', k.prio, unpack(moved)) end
      -- A full page with entries dropped or moved: the level may hold more due.
      more = #rows == ask and ng + nm > 0 and n < want
    end
  end
  return ids, due, taken
end

-- Claim's whole look with priorities: the index's due tasks, then the scheduled set's in
-- due order (those not taken already), scan rows in all.
local function dq_prio_rows(k, horizon, scan)
  local ids, due, taken = dq_prio_due(k, horizon, scan)
  local n = #ids
  if n < scan then
    local rest = redis.call('ZRANGEBYSCORE', k.scheduled, '-inf', horizon,
      'WITHSCORES', 'LIMIT', 0, scan)
    for i = 1, #rest, 2 do
      if n >= scan then break end
      local id = rest[i]
      if not taken[id] then
        n = n + 1
        ids[n], due[2 * n - 1], due[2 * n] = id, id, rest[i + 1]
      end
    end
  end
  return ids, due
end

-- After a claim with priorities, before its leases are added: the claimed tasks leave the
-- index. The marker goes once no task can come back into it: the index is empty, no task
-- is leased (a retry or a reaped lease puts a prioritised one back) and this claim took
-- none with a priority (any).
local function dq_prio_claimed(k, ids, any)
  if #ids > 0 then redis.call('ZREM', k.prio, unpack(ids)) end
  -- (ZCARD, not EXISTS: the commands of docs/operations.md's ACL rule)
  if not any and redis.call('ZCARD', k.prio) == 0 and redis.call('ZCARD', k.active) == 0 then
    redis.call('HDEL', k.control, 'prio')
  end
end
