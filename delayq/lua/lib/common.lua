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
  if string.sub(spec, 1, 1) == '+' then return now + tonumber(string.sub(spec, 2)) end
  return tonumber(spec)
end

-- A record is "<json header>\n<payload>". Returns header table (nil if undecodable), payload.
-- A header with an infinite or NaN number counts as undecodable: it could not be written back.
local function dq_split(rec)
  local nl = string.find(rec, '\n', 1, true)
  if not nl then return nil, rec end
  local payload = string.sub(rec, nl + 1)
  local ok, h = pcall(cjson.decode, string.sub(rec, 1, nl - 1))
  if not ok or type(h) ~= 'table' or type(h.k) ~= 'string' then return nil, payload end
  h.a = tonumber(h.a) or 0
  h.m = tonumber(h.m) or 0
  h.t = tonumber(h.t) or 0
  for _, v in pairs(h) do
    if type(v) == 'number' and (v ~= v or v == math.huge or v == -math.huge) then
      return nil, payload
    end
  end
  return h, payload
end

-- The record for a changed header, or nil when it cannot be encoded (a value nested in the
-- header that cjson refuses). Callers encode before they move the task anywhere.
local function dq_join(h, payload)
  local ok, head = pcall(cjson.encode, h)
  if not ok then return nil end
  return head .. '\n' .. payload
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
