local K = {scheduled = KEYS[1], active = KEYS[2], tasks = KEYS[3], errors = KEYS[4], stats = KEYS[5], xkeys = KEYS[6], attempts = KEYS[7]}
local A = {now = ARGV[1], key = ARGV[2]}
local REST = 3
-- expire_delete: stop watching a key (step 1 of expiring.delete; step 2 deletes the key).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] tasks
-- KEYS[4] errors
-- KEYS[5] stats
-- KEYS[6] xkeys
-- KEYS[7] attempts
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] key        the watched key
-- REPLY cancelled
-- Returns: 1 if a waiting expiry was cancelled, else 0.
-- Only a key that has not expired is cancelled (waiting, or claimed ahead of its deadline:
-- the claim is revoked). An expiry that happened is still delivered, and a mapping stays
-- with its task's record (a bell about the key is then not taken for a foreign key's).
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

-- Watched keys' lifecycle (docs/expiring.md, "The lifecycle"), prepended to scripts that say
-- "--@include expire". Needs: common. A watched key's task has the id "x:<16 chars>:<key>"
-- (expiring.task_id_for), so the key is read back from the id, never built.

-- The state of a watched key's task id at now, as the table names it:
--   'alive'    waiting, never attempted, its due time (deadline + 1) still ahead
--   'ahead'    claimed on its first attempt ahead of its due time (the worker's lookahead)
--   'expired'  waiting, never attempted, due (its deadline passed, or the bell moved it)
--   'claimed'  held by a worker at or past its due time, or on a later attempt
--   'retrying' waiting after an attempt (failed, or its lease expired)
--   'finished' delivered (done) or died (dead): its record stays, so does the mapping
--   'none'     no task, or a mapping its record did not outlive
-- Only 'alive' and 'ahead' are still replaceable: the key has not expired. k holds scheduled,
-- active, tasks and attempts.
local function dq_watch_state(k, id, now)
  if not id then return 'none' end
  if redis.call('HEXISTS', k.tasks, id) == 0 then return 'none' end  -- 0 is true in Lua
  local due = redis.call('ZSCORE', k.scheduled, id)
  if due then
    local _, a = dq_attempt(k, id)
    if a and a > 0 then return 'retrying' end
    if tonumber(due) > now then return 'alive' end
    return 'expired'
  end
  if redis.call('ZSCORE', k.active, id) then
    local _, a, d = dq_attempt(k, id)
    if a == 1 and d and d > now then return 'ahead' end
    return 'claimed'
  end
  return 'finished'
end

-- Drop a task that is still replaceable ('alive' or 'ahead'): a claim ahead is revoked, so the
-- worker that holds it finds its lease gone at the deadline and runs no callback.
local function dq_watch_drop(k, id)
  redis.call('ZREM', k.scheduled, id)
  redis.call('ZREM', k.active, id)
  dq_forget(k, {id})
end

-- A watched key's mapping goes with its task's record: called where records are forgotten
-- (ack's trimming, cancel, purge). Ids of other tasks are skipped. k holds xkeys.
local function dq_unwatch(k, ids)
  for _, id in ipairs(ids) do
    if string.sub(id, 1, 2) == 'x:' then
      local key = string.match(id, '^x:[^:]*:(.*)$')
      if key and redis.call('HGET', k.xkeys, key) == id then
        redis.call('HDEL', k.xkeys, key)
      end
    end
  end
end

-- Forget, a few per call, the tasks of a finished set (done, aborted) whose dedupe window
-- ended by upto: their set entries, records and watched keys' mappings.
local function dq_trim_finished(k, set, upto, limit)
  local old = redis.call('ZRANGEBYSCORE', set, '-inf', upto, 'LIMIT', 0, limit)
  if #old > 0 then
    redis.call('ZREM', set, unpack(old))
    dq_forget(k, old)
    dq_unwatch(k, old)
  end
end

local now = dq_now(A.now)
local id = redis.call('HGET', K.xkeys, A.key)
local state = dq_watch_state(K, id, now)
if state == 'alive' or state == 'ahead' then
  dq_watch_drop(K, id)
  redis.call('HDEL', K.xkeys, A.key)
  redis.call('HINCRBY', K.stats, 'cancelled', 1)
  return 1
end
if id and state == 'none' then redis.call('HDEL', K.xkeys, A.key) end
return 0
