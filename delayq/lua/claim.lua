-- claim: lease the tasks due by now + lookahead, oldest first, after reaping expired leases.
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] dead
-- KEYS[5] errors
-- KEYS[6] stats
-- KEYS[7] workers
-- KEYS[8] workers_seen
-- KEYS[9] attempts
-- KEYS[10] control
-- KEYS[11] prio
-- ARGV[1] now           ms, or "" for the server's TIME
-- ARGV[2] lookahead_ms  also claim tasks due this soon; the worker starts them on a local timer
-- ARGV[3] limit         at most this many tasks
-- ARGV[4] lease_ms      lease length, counted from the later of now and the task's due time
-- ARGV[5] reap_limit    reap at most this many expired leases first
-- ARGV[6] worker        the claiming worker's id ("" = do not register)
-- ARGV[7] worker_info   its registration (JSON; "" = unchanged since the last one)
-- ARGV[8] channel       the wake channel: told when a new lease ends before every lease held
-- ARGV[9...] rooms      pairs "kind room": take at most room more tasks of that kind (the
--                       worker's per-kind concurrency); none: every kind, the plain path
-- REPLY {now, next_due, next_lease, next_token} then per task {id, kind, attempt, max_attempts, token, due, created, format, headers, payload}
-- Returns: {now (in microseconds), next_due, next_lease_deadline, next_token, then per task: id, kind,
--          attempt, max_attempts, token, due, created, format ("" for JSON), headers (their
--          JSON object as the record holds it, "" for none), payload}; the
--          other times are ms (-1 when there is none); a due time with microseconds comes
--          as a string. The header's fields come decoded, so the worker parses no JSON but
--          the payload's. A record whose header cannot be decoded goes to the dead set.
-- The record is not rewritten: the attempt's token, number and due time go to the attempts
-- hash (dq_attempt_text), a few bytes per task.
-- Admission (the control key, one HMGET per call that finds a task due; see lib/admit.lua):
-- while the shard is paused nothing is claimed and next_due is -1 (resume publishes a
-- wake-up); expired leases are still reaped. A rate limit takes one token per task claimed; when due tasks are left
-- for want of tokens, next_token is when the next one is available (else -1). With rooms,
-- a kind whose room is used up is skipped: its tasks stay scheduled for other workers, and
-- the claim looks at most ADMIT_SCAN rows past limit for other kinds. Then next_due is the
-- first due time after the skipped rows, or -1 when the look was cut short (the worker
-- looks again when one of its runs ends).
-- Priorities (lib/prio.lua): when the controls' HMGET finds the marker "prio", the due
-- tasks of the prio index come first, highest level first, then the rest by due time; a
-- queue without one runs none of this. With priorities and rooms, skipped rows cut the look.
--@include admit
--@include admit_gate
--@include attempt_count
--@include attempt_text
--@include bury
--@include clock_us
--@include head
--@include prio_claim
--@include prio_of
--@include reap
--@include record_cached
--@include register
--@include time_text
--@include wake
local now, now_us = dq_now_us(A.now)
dq_register(K, A.worker, A.worker_info, now)

-- An idle worker runs this every max_wait: look at the two heads first, and run the range
-- queries only when a lease has expired or a task is due.
local function first_lease()
  local first = redis.call('ZRANGE', K.active, 0, 0, 'WITHSCORES')
  return first[2] and tonumber(first[2])
end
local lease_head = first_lease()
if lease_head and lease_head <= now then
  dq_reap(K, now, tonumber(A.reap_limit))
  lease_head = first_lease()
end

local limit = tonumber(A.limit)
local out = {now_us, -1, -1, -1}
local head = dq_head(K.scheduled)
local horizon = now + tonumber(A.lookahead_ms)
local taken, skipped, cut = 0, 0, false
-- The controls matter only to a claim that finds a task due: an idle look does not read
-- them (it would be one more command every max_wait for every idle worker).
local gate, prio = nil, false
if limit > 0 and head and head <= horizon then
  gate, prio = dq_admit_gate(K.control, now, limit)
  if gate then limit = gate.limit end
end
if limit > 0 and head and head <= horizon then
  local rooms = dq_admit_rooms(REST)
  local scan = limit
  if rooms then scan = limit + ADMIT_SCAN end
  local ids, due = {}, nil
  if prio then
    ids, due = dq_prio_rows(K, horizon, scan)
  else
    due = redis.call('ZRANGEBYSCORE', K.scheduled, '-inf', horizon,
      'WITHSCORES', 'LIMIT', 0, scan)
    for i = 1, #due, 2 do ids[(i + 1) / 2] = due[i] end
  end
  local recs = #ids > 0 and redis.call('HMGET', K.tasks, unpack(ids))
  local cache = {}  -- see dq_split_cached
  if rooms and #ids > 0 then
    ids, due, recs, skipped, cut = dq_admit_kinds(ids, due, recs, rooms, limit, scan, cache)
    if prio and skipped > 0 then cut = true end  -- (the skipped rows are not the set's first)
  end
  if #ids > 0 then
    local states = redis.call('HMGET', K.attempts, unpack(ids))
    local token = redis.call('HINCRBY', K.stats, 'claim_seq', #ids) - #ids
    local lease = tonumber(A.lease_ms)
    -- Tables grow by index counters (n, o): "#t + 1" costs a search on every insert.
    local claims, leases, corrupt, n, o = {}, {}, {}, 0, #out
    local any = false  -- a task with a priority taken
    for j, id in ipairs(ids) do
      local at = tonumber(due[2 * j])
      local h, payload, created, hs = nil, nil, nil, nil
      if recs[j] then h, payload, created, hs = dq_split_cached(recs[j], cache) end
      if h then
        if prio and not any then any = dq_prio_of(h) ~= nil end
        -- A task never claimed has no entry: its first attempt.
        local attempt = 1
        if states[j] then attempt = dq_attempt_count(states[j]) + 1 end
        token = token + 1
        claims[n + 1] = id
        claims[n + 2] = dq_attempt_text(token, attempt, due[2 * j])
        leases[n + 1] = math.max(now, at) + lease
        leases[n + 2] = id
        n = n + 2
        out[o + 1] = id
        out[o + 2] = h.k
        out[o + 3] = attempt
        out[o + 4] = h.m
        out[o + 5] = token
        out[o + 6] = at % 1 == 0 and at or dq_ms(at)  -- ms, maybe with us
        out[o + 7] = created or 0
        out[o + 8] = type(h.f) == 'string' and h.f or ''
        out[o + 9] = hs
        out[o + 10] = payload
        o = o + 10
      elseif recs[j] then
        corrupt[#corrupt + 1] = id
      end
    end
    taken = n / 2
    -- Every task's claim is built before any task leaves the scheduled set.
    redis.call('ZREM', K.scheduled, unpack(ids))
    if prio then dq_prio_claimed(K, ids, any) end
    if n > 0 then
      redis.call('HSET', K.attempts, unpack(claims))
      redis.call('ZADD', K.active, unpack(leases))
      -- Idle workers sleep until the earliest lease they know of; one that ends sooner
      -- (the first lease, or a shorter one) must reach them for its reaping to be on time.
      dq_wake(A.channel, lease_head, leases[1])
    end
    for _, id in ipairs(corrupt) do
      dq_bury(K, id, now, 'record cannot be decoded (corrupt or written by another program)')
    end
  end
  head = dq_head(K.scheduled)
  lease_head = first_lease()
end
if gate or skipped > 0 then
  head, out[4] = dq_admit_reply(K, gate, now, horizon, head, taken, skipped, cut)
end
if head then out[2] = head end
if lease_head then out[3] = lease_head end
return out
