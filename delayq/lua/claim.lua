-- claim: lease the tasks due by now + lookahead, oldest first, after reaping expired leases.
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] dead
-- KEYS[5] errors
-- KEYS[6] stats
-- ARGV[1] now           ms, or "" for the server's TIME
-- ARGV[2] lookahead_ms  also claim tasks due this soon; the worker starts them on a local timer
-- ARGV[3] limit         at most this many tasks
-- ARGV[4] lease_ms      lease length, counted from the later of now and the task's due time
-- ARGV[5] reap_limit    reap at most this many expired leases first
-- Returns: {now, next_due, next_lease_deadline, id1, record1, id2, record2, ...}; the times are
--          ms (-1 when there is none); each record carries the new attempt and lease token.
--          A record whose header cannot be decoded goes to the dead set instead.
--@include common
--@include reap
local now = dq_now(A.now)
dq_reap(K, now, tonumber(A.reap_limit))

local limit = tonumber(A.limit)
local out = {now, -1, -1}
if limit > 0 then
  local due = redis.call('ZRANGEBYSCORE', K.scheduled, '-inf', now + tonumber(A.lookahead_ms),
    'WITHSCORES', 'LIMIT', 0, limit)
  local n = #due / 2
  local token = 0
  if n > 0 then token = redis.call('HINCRBY', K.stats, 'claim_seq', n) - n end
  local lease = tonumber(A.lease_ms)
  for i = 1, #due, 2 do
    local id, at = due[i], tonumber(due[i + 1])
    -- Build the new record before the task leaves the scheduled set: a script error after
    -- that point would leave it in no set at all.
    local rec = redis.call('HGET', K.tasks, id)
    local h, payload, new = nil, nil, nil
    if rec then h, payload = dq_split(rec) end
    if h then
      token = token + 1
      h.a = h.a + 1
      h.t = token
      h.d = at
      new = dq_join(h, payload)
    end
    redis.call('ZREM', K.scheduled, id)
    if new then
      redis.call('HSET', K.tasks, id, new)
      redis.call('ZADD', K.active, math.max(now, at) + lease, id)
      out[#out + 1] = id
      out[#out + 1] = new
    elseif rec then
      dq_bury(K, id, now, 'record cannot be decoded (corrupt or written by another program)')
    end
  end
end
local head = dq_head(K.scheduled)
if head then out[2] = head end
local first_lease = redis.call('ZRANGE', K.active, 0, 0, 'WITHSCORES')
if first_lease[2] then out[3] = tonumber(first_lease[2]) end
return out
