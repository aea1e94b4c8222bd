local K = {scheduled = KEYS[1], active = KEYS[2], dead = KEYS[3], done = KEYS[4], tasks = KEYS[5], errors = KEYS[6], stats = KEYS[7], attempts = KEYS[8], aborted = KEYS[9], cancelled = KEYS[10], control = KEYS[11], prio = KEYS[12]}
local A = {now = ARGV[1], dedupe_ms = ARGV[2], replace = ARGV[3], channel = ARGV[4], durable = ARGV[5]}
local REST = 6
-- schedule: add tasks to the scheduled set; an id already known is left alone unless replaced.
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] dead
-- KEYS[4] done
-- KEYS[5] tasks
-- KEYS[6] errors
-- KEYS[7] stats
-- KEYS[8] attempts
-- KEYS[9] aborted
-- KEYS[10] cancelled
-- KEYS[11] control
-- KEYS[12] prio
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] dedupe_ms  how long a finished id counts as done
-- ARGV[3] replace    "1": move a waiting task (its attempts so far kept), re-create a done,
--                    aborted or dead one
-- ARGV[4] channel    wake-up channel
-- ARGV[5] durable    "1": write even if nothing changes, so that the WAITAOF after it also
--                    covers an earlier, unconfirmed call that wrote these tasks (a resend)
-- ARGV[6...] tasks   triples: id, due ("+ms" from now, or absolute ms), record; (protocol
--                    1.1) a due "p<N>:<due>" gives the task priority N (0-9, 0 none; the
--                    record's "p" says the same): the task is also indexed in prio (lib/prio.lua).
--                    A waiting task replaced with a due that gives none keeps its priority
--                    (the new record is given its "p").
-- REPLY per task {status} then {now}
-- Returns: one status per task: 1 created, 2 replaced, 0 unchanged (waiting, running,
--          done or aborted within the dedupe window, or dead), 3 not replaced because it is running
--          (only with replace "1": a running task is never replaced); then (protocol 1.1) the
--          now the call ran at, ms: a task created or replaced is stored due at now + ms for
--          a due "+ms", at the number sent otherwise (lib/due.lua). A 1.0 caller reads the
--          statuses alone: they are where they were.
-- The one clock: the server's TIME in ms, unless the caller passes an explicit "now"
-- (tests run a script as of a given time).
local function dq_now(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- "+<ms>" is relative to now; anything else is an absolute ms timestamp.
local function dq_due(spec, now)
  if string.byte(spec) == 43 then return now + tonumber(string.sub(spec, 2)) end  -- '+'
  return tonumber(spec)
end
-- Earliest due time in the scheduled set, or false when it is empty.
local function dq_head(scheduled)
  local head = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
  if head[2] then return tonumber(head[2]) end
  return false
end
-- Priorities (docs/priorities.md): a waiting task scheduled with a priority 1-9 is in the
-- scheduled set as every task is, and also in the prio index, scored (10 - p) * PRIO_STEP +
-- due, so that each level is one range of scores, its tasks in due order. The control
-- hash's field "prio" is set while the index may hold tasks: claim reads it in the HMGET it
-- makes of the controls anyway, so a queue with no prioritised task pays no command for
-- priorities. The scheduled set stays the truth: claim repairs or drops an index entry
-- that disagrees with it (a task cancelled, or moved by a script that knows no index).

local PRIO_STEP = 1e13  -- ms: past year 2286; (10 - p) * PRIO_STEP + due stays below 2^53

-- A task's score in the index at level p (1-9), due at due (ms).
local function dq_prio_score(p, due)
  return (10 - p) * PRIO_STEP + due
end

-- The level (1-9) of a score in the prio index (lib/prio.lua).
local function dq_prio_level(score)
  return 10 - math.floor(score / PRIO_STEP)
end


-- Index a waiting task at level p (1-9) due at due, and mark the shard as having one.
local function dq_prio_put(k, id, p, due)
  redis.call('ZADD', k.prio, dq_prio_score(p, due), id)
  redis.call('HSET', k.control, 'prio', '1')
end
-- Tell idle workers about a due time earlier than the head they know of.
local function dq_wake(channel, old_head, new_due)
  if new_due and (not old_head or new_due < old_head) then
    redis.call('PUBLISH', channel, tostring(new_due))
  end
end
-- A due argument of protocol 1.1 may say the task's priority: "p<N>:<due>" (N one digit,
-- 0 for none). Returns N (nil when not said, or not a digit 0-9) and the due argument.
local function dq_prio_spec(spec)
  if string.byte(spec) == 112 then  -- 'p'
    local p = tonumber(string.sub(spec, 2, 2))
    if p and p >= 0 and p <= 9 and p % 1 == 0 and string.byte(spec, 3) == 58 then
      return p, string.sub(spec, 4)
    end
  end
  return nil, spec
end
local now = dq_now(A.now)
local dedupe = tonumber(A.dedupe_ms)
local replace = A.replace == '1'
local old_head = dq_head(K.scheduled)
local min_due = false
local created = 0
local out = {}
local fresh, nf = {}, 0  -- ids new to the queue
local no = 0

-- New ids, the common case, cost no command each: one HMGET of the records per BATCH tasks
-- tells them apart, and their records and due times are written by one variadic HSET and
-- one ZADD per batch. A known id's checks (below) flush what is pending first, so they
-- read the keys as if each task had been written at once; an id given twice in one call
-- is known the second time (seen). A batch of one task (a single schedule) takes one HSETNX
-- instead, which also writes the record of a new id (written).
local BATCH = 1000
local hargs, zargs, nz = {}, {}, 0
local written = false
-- Prioritised tasks to index once their records are written: id, priority, due.
local pq, np = {}, 0
local function prioritise(id, p, due)
  pq[np + 1], pq[np + 2], pq[np + 3] = id, p, due
  np = np + 3
end

local function flush()
  if nz > 0 then
    if not written then redis.call('HSET', K.tasks, unpack(hargs, 1, nz)) end
    redis.call('ZADD', K.scheduled, unpack(zargs, 1, nz))
    nz = 0
  end
end

local function enqueue(id, due, rec)
  hargs[nz + 1] = id
  hargs[nz + 2] = rec
  zargs[nz + 1] = due
  zargs[nz + 2] = id
  nz = nz + 2
  if not min_due or due < min_due then min_due = due end
end

-- A new incarnation of a known id: a new record, and its attempts start again from none.
local function put(id, due, rec)
  redis.call('HDEL', K.attempts, id)
  redis.call('ZREM', K.prio, id)  -- (an entry a 1.0 cancel left; dq_prio_put may add it back)
  enqueue(id, due, rec)
end

-- A waiting task replaced: a new record and due time, but the attempts it has made (its
-- attempts entry) and its last error stay, so a producer that always replaces cannot keep a
-- failing task from dying.
-- Its priority (the p of its due argument): given, the index follows it; not given (nil),
-- a prioritised task keeps its level, written into the new record.
local function move(id, due, rec, p)
  if p == nil then
    local score = redis.call('ZSCORE', K.prio, id)
    if score then
      p = dq_prio_level(tonumber(score))
      rec = '{"p":' .. p .. ',' .. string.sub(rec, 2)
    end
  end
  if p and p > 0 then
    prioritise(id, p, due)
  elseif p == 0 then
    redis.call('ZREM', K.prio, id)
  end
  enqueue(id, due, rec)
end

-- known: the batch's records (nil for a batch of one: then had, whether its id has one).
local ids, seen, known, had, j = nil, nil, nil, false, 0
for i = REST, #ARGV, 3 do
  if j == 0 then
    flush()
    if i + 2 >= #ARGV then
      written = redis.call('HSETNX', K.tasks, ARGV[i], ARGV[i + 2]) == 1
      known, had = nil, not written
    else
      written = false
      ids, seen = ids or {}, seen or {}
      local n = 0
      for b = i, math.min(i + 3 * BATCH - 1, #ARGV), 3 do
        n = n + 1
        ids[n] = ARGV[b]
      end
      known = redis.call('HMGET', K.tasks, unpack(ids, 1, n))
    end
  end
  j = j + 1
  local id, rec = ARGV[i], ARGV[i + 2]
  local p, spec = dq_prio_spec(ARGV[i + 1])
  local due = dq_due(spec, now)
  local status = 0
  if known then had = known[j] or seen[id] end
  if not had then
    -- Every known task has a record, so no record means a new id: the common, cheap case.
    if seen then seen[id] = true end
    enqueue(id, due, rec); status = 1
    nf = nf + 1
    fresh[nf] = id
  elseif flush() or redis.call('ZSCORE', K.active, id) then  -- (flush returns nil)
    if replace then status = 3 end  -- never replaced; the caller is told
  elseif redis.call('ZSCORE', K.scheduled, id) then
    if replace then
      move(id, due, rec, p); status = 2
    end
  else
    -- An aborted task counts as finished: remembered for the dedupe window.
    local ended = K.done
    local finished = redis.call('ZSCORE', K.done, id)
    if not finished then
      ended = K.aborted
      finished = redis.call('ZSCORE', K.aborted, id)
    end
    local dead = redis.call('ZSCORE', K.dead, id)
    if finished and (replace or tonumber(finished) < now - dedupe) then
      redis.call('ZREM', ended, id)
      redis.call('HDEL', K.errors, id)
      put(id, due, rec); status = replace and 2 or 1
    elseif dead and replace then
      redis.call('ZREM', K.dead, id)
      redis.call('HDEL', K.errors, id)
      put(id, due, rec); status = 2
    elseif not finished and not dead then
      put(id, due, rec); status = 1
    end
    if status == 2 and p and p > 0 then prioritise(id, p, due) end
  end
  if status == 1 or status == 2 then
    created = created + 1
    if status == 1 and p and p > 0 then prioritise(id, p, due) end
  end
  no = no + 1
  out[no] = status
  if j == BATCH then j = 0 end
end
flush()
for i = 1, np, 3 do dq_prio_put(K, pq[i], pq[i + 1], pq[i + 2]) end
-- A new id has no attempt state, unless a script of an earlier version deleted its record
-- and left the entry (they knew no attempts hash): a new task must not inherit it. Nor the
-- tombstone of a cancel (a cancelled id has no record, so it is new here).
for i = 1, nf, 1000 do
  local last = math.min(i + 999, nf)
  redis.call('HDEL', K.attempts, unpack(fresh, i, last))
  if K.cancelled then redis.call('ZREM', K.cancelled, unpack(fresh, i, last)) end
end
if created > 0 or A.durable == '1' then redis.call('HINCRBY', K.stats, 'scheduled', created) end
dq_wake(A.channel, old_head, min_due)
out[no + 1] = now
return out
