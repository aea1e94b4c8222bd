local K = {scheduled = KEYS[1], active = KEYS[2], dead = KEYS[3], done = KEYS[4], tasks = KEYS[5], errors = KEYS[6], stats = KEYS[7], attempts = KEYS[8], aborted = KEYS[9]}
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
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] dedupe_ms  how long a finished id counts as done
-- ARGV[3] replace    "1": move a waiting task (its attempts so far kept), re-create a done,
--                    aborted or dead one
-- ARGV[4] channel    wake-up channel
-- ARGV[5] durable    "1": write even if nothing changes, so that the WAITAOF after it also
--                    covers an earlier, unconfirmed call that wrote these tasks (a resend)
-- ARGV[6...] tasks   triples: id, due ("+ms" from now, or absolute ms), record
-- REPLY per task {status}
-- Returns: one status per task: 1 created, 2 replaced, 0 unchanged (waiting, running,
--          done or aborted within the dedupe window, or dead), 3 not replaced because it is running
--          (only with replace "1": a running task is never replaced).
-- Shared helpers, prepended to scripts that say "--@include common".

-- The one clock: the server's TIME in ms, unless the caller passes an explicit "now"
-- (tests run a script as of a given time).
local function dq_now(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- dq_now, and the same instant to the microsecond: a worker maps the server's clock onto
-- its own from a claim's reply, and TIME's milliseconds, rounded down, would start its
-- timers up to a millisecond late (half of one on average).
local function dq_now_us(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg), tonumber(arg) * 1000 end
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- "+<ms>" is relative to now; anything else is an absolute ms timestamp.
local function dq_due(spec, now)
  if string.byte(spec) == 43 then return now + tonumber(string.sub(spec, 2)) end  -- '+'
  return tonumber(spec)
end

-- Whether a header's number can be carried by a reply and written as an integer (%d): not
-- NaN, and within the doubles that hold every integer exactly (2^53).
local function dq_finite(v)
  return v == nil or (v == v and v < 9007199254740992 and v > -9007199254740992)
end

-- A record is "<json header>\n<payload>". Returns header table (nil if undecodable), payload.
-- A header with a number dq_finite refuses counts as undecodable.
local function dq_split(rec)
  local nl = string.find(rec, '\n', 1, true)
  if not nl then return nil, rec end
  local payload = string.sub(rec, nl + 1)
  local ok, h = pcall(cjson.decode, string.sub(rec, 1, nl - 1))
  if not ok or type(h) ~= 'table' or type(h.k) ~= 'string' then return nil, payload end
  h.m = tonumber(h.m) or 0
  h.c = tonumber(h.c)
  if not (dq_finite(h.m) and dq_finite(h.c)) then return nil, payload end
  return h, payload
end

-- dq_split for a claim's batch. A producer writes a header as '<fields>,"c":<created>}', or
-- '<fields>,"c":<created>,"h":<headers>}' with headers (codec.record_prefix and
-- encode_headers), and the fields before "c" (kind, max attempts, format) repeat across a
-- queue's tasks: they are decoded once per call, in cache. The header returned is shared
-- between tasks: read it, never change it. Returns header (nil if undecodable), payload,
-- created (nil if unknown), headers (their JSON object as text, undecoded; '' for none).
-- Any other header (fields in another order, an "h" before "c", whitespace, fields after
-- "h") is decoded whole, by dq_split: the same fields, more slowly.
local function dq_split_cached(rec, cache)
  local nl = string.find(rec, '\n', 1, true)
  if not nl then return nil, rec end
  -- The producers' two forms, by plain finds (memchr) and anchored matches: the first ',"c":'
  -- (no JSON string holds one unescaped), then only digits and '}' to the line's end; or
  -- digits, ',"h":{' and an object whose first '}' ends it right before the line's last
  -- (it holds no other, so it is all of "h", and "h" is the last field).
  local pre, c, hs = nil, nil, ''
  local at = string.find(rec, ',"c":', 1, true)
  if at and at < nl then
    local _, e
    _, e, c = string.find(rec, '^(%d+)}\n', at + 5)
    if e then
      pre = string.sub(rec, 1, at - 1)
    else
      _, e, c = string.find(rec, '^(%d+),"h":{', at + 5)
      if e and string.byte(rec, nl - 1) == 125 and string.find(rec, '}', e, true) == nl - 2 then
        pre, hs = string.sub(rec, 1, at - 1), string.sub(rec, e, nl - 2)
      end
    end
  end
  if pre then
    local h = cache[pre]
    if h == nil then
      h = dq_split(pre .. '}\n') or false
      -- Headers among the fields before "c" (another program's order): read whole.
      if h and h.h ~= nil then h = false end
      cache[pre] = h
    end
    local created = tonumber(c)
    if h and dq_finite(created) then return h, string.sub(rec, nl + 1), created, hs end
  end
  local h, payload = dq_split(rec)
  hs = ''
  -- Whatever "h" holds goes to the worker, which refuses anything but an object of strings
  -- (as get() does); null is none. (Encoding fails on what cjson decodes but cannot write,
  -- a number too big for a double, say: undecodable.)
  if h and h.h ~= nil and h.h ~= cjson.null then
    local ok, text = pcall(cjson.encode, h.h)
    if not ok then return nil, payload end
    hs = text
  end
  return h, payload, h and h.c, hs
end

-- A time for a reply or a stored text: a whole ms as an integer, one with microseconds with
-- three decimals (Lua's tostring keeps 14 digits and would round them away).
local function dq_ms(x)
  if x % 1 == 0 then return string.format('%d', x) end
  return string.format('%.3f', x)
end

-- A task's attempt state: the lease token, attempt number and due time of its current or
-- last claim, kept in the attempts hash as "<token> <attempt> <due>" apart from the record,
-- so that a claim writes these few bytes instead of rewriting the record. Only these
-- functions read or write that text.
local function dq_attempt_parse(raw)
  local t, a, d = string.match(raw, '^(%d+) (%d+) ?(%S*)$')
  return tonumber(t) or 0, tonumber(a) or 0, tonumber(d)
end

-- The token alone (fencing) and the attempt alone (claim): one short match each.
local function dq_attempt_token(raw)
  return tonumber(string.match(raw, '^%d+'))
end

local function dq_attempt_count(raw)
  return tonumber(string.match(raw, '^%d+ (%d+)')) or 0
end

-- due: the due time as text (a score as Redis returns it, or dq_ms of a number; '' if none).
local function dq_attempt_text(t, a, due)
  return string.format('%d %d %s', t, a, due)
end

-- One task's attempt state: token, attempt, due (see dq_attempt_parse); nil when it has
-- none (never claimed). k holds attempts.
local function dq_attempt(k, id)
  local raw = redis.call('HGET', k.attempts, id)
  if raw then return dq_attempt_parse(raw) end
  return nil
end

-- Forget tasks: record, attempt state and last error. k holds tasks, attempts and errors.
local function dq_forget(k, ids)
  redis.call('HDEL', k.tasks, unpack(ids))
  redis.call('HDEL', k.attempts, unpack(ids))
  redis.call('HDEL', k.errors, unpack(ids))
end

-- Earliest due time in the scheduled set, or false when it is empty.
local function dq_head(scheduled)
  local head = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
  if head[2] then return tonumber(head[2]) end
  return false
end

-- Tell idle workers about a due time earlier than the head they know of.
local function dq_wake(channel, old_head, new_due)
  if new_due and (not old_head or new_due < old_head) then
    redis.call('PUBLISH', channel, tostring(new_due))
  end
end

-- Errors are kept short enough to read in a dashboard, long enough for a traceback.
local function dq_set_error(errors, id, text)
  if string.len(text) > 8192 then text = string.sub(text, 1, 8192) .. '...' end
  redis.call('HSET', errors, id, text)
end

-- A task moves to the dead set; the record and the reason stay for inspection and replay.
local function dq_bury(k, id, now, reason)
  redis.call('ZADD', k.dead, now, id)
  dq_set_error(k.errors, id, reason)
  redis.call('HINCRBY', k.stats, 'dead', 1)
end

-- Move a leased task back to the scheduled set. Returns the earlier of due and min_due,
-- so a batch can announce its earliest due time once.
local function dq_requeue(k, id, due, min_due)
  redis.call('ZREM', k.active, id)
  redis.call('ZADD', k.scheduled, due, id)
  if not min_due or due < min_due then return due end
  return min_due
end

-- Workers register on claims and heartbeats (no extra command for an idle worker). An
-- unchanged registration ("" info) only refreshes the time seen, one write; a full one also
-- drops entries not seen for a day, a few per call.
local function dq_register(k, id, info, now)
  if id == '' then return end
  redis.call('ZADD', k.workers_seen, now, id)
  if info == '' then return end
  redis.call('HSET', k.workers, id, info)
  local old = redis.call('ZRANGEBYSCORE', k.workers_seen, '-inf', now - 86400000, 'LIMIT', 0, 5)
  if #old > 0 then
    redis.call('ZREM', k.workers_seen, unpack(old))
    redis.call('HDEL', k.workers, unpack(old))
  end
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
  enqueue(id, due, rec)
end

-- A waiting task replaced: a new record and due time, but the attempts it has made (its
-- attempts entry) and its last error stay, so a producer that always replaces cannot keep a
-- failing task from dying.
local function move(id, due, rec)
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
  local id, due, rec = ARGV[i], dq_due(ARGV[i + 1], now), ARGV[i + 2]
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
      move(id, due, rec); status = 2
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
  end
  if status == 1 or status == 2 then created = created + 1 end
  no = no + 1
  out[no] = status
  if j == BATCH then j = 0 end
end
flush()
-- A new id has no attempt state, unless a script of an earlier version deleted its record
-- and left the entry (they knew no attempts hash): a new task must not inherit it.
for i = 1, nf, 1000 do
  redis.call('HDEL', K.attempts, unpack(fresh, i, math.min(i + 999, nf)))
end
if created > 0 or A.durable == '1' then redis.call('HINCRBY', K.stats, 'scheduled', created) end
dq_wake(A.channel, old_head, min_due)
return out
