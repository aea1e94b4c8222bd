local K = {shards = KEYS[1], scheduled = KEYS[2], active = KEYS[3], dead = KEYS[4]}
local A = {want = ARGV[1], store = ARGV[2], protocol = ARGV[3]}
local REST = 4
-- shards: read, or set once, into how many shards a queue is split, the protocol version
-- the queue speaks, and the settings its producers follow.
-- KEYS[1] shards
-- KEYS[2] scheduled
-- KEYS[3] active
-- KEYS[4] dead
-- ARGV[1] want      the shard count this process was opened with
-- ARGV[2] store     "1" (a write): store want if no count is stored, and the protocol stamp;
--                   "0" (get, cancel, reschedule): only read
-- ARGV[3] protocol  the protocol version this process speaks, "<major>.<minor>"
-- REPLY {count, protocol, dedupe_ms, max_payload, codec} | status
-- Returns: {count, protocol, ...}: the stored count (0 when none is stored and store is "0"),
-- the stored protocol version ("" when the queue has none: it was never written, or was
-- written before versions were stored), and the queue's settings as `delayq settings`
-- stored them (protocol 1.1; each "" when not stored: the producer's default applies):
-- dedupe_ms (the dedupe window, ms), max_payload (bytes), codec ("json" or "msgpack").
-- Read only, never written here (settings.lua writes them); status -1 while the queue is being resharded (field
-- "moving", set by operate.reshard), whatever the count. The first process to write to the
-- queue stores its count (one included), so two processes that disagree cannot both go on.
-- A count above one is stored only while the unsplit queue has nothing waiting, running or
-- dead, so no task is stranded by a split; otherwise 1 is stored and returned.
-- A write stamps the queue with its protocol version when it has none, or raises the minor
-- of the same major; a queue of another major is left untouched (nothing is written): the
-- caller refuses it.
local stored = redis.call('HMGET', K.shards, 'n', 'moving', 'protocol', 'dedupe_ms',
  'max_payload', 'codec')
if stored[2] then return -1 end
local proto = stored[3] or ''
local dedupe, most, codec = stored[4] or '', stored[5] or '', stored[6] or ''

local function version(v)
  local major, minor = string.match(v, '^(%d+)%.?(%d*)$')
  return tonumber(major), tonumber(minor) or 0
end

if A.store ~= '1' then return {tonumber(stored[1] or '0'), proto, dedupe, most, codec} end
local major, minor = version(A.protocol)
if proto ~= '' then
  local has_major, has_minor = version(proto)
  if has_major ~= major then
    return {tonumber(stored[1] or '0'), proto, dedupe, most, codec}
  end
  if has_minor < minor then proto = '' end
end
if proto == '' then
  redis.call('HSET', K.shards, 'protocol', A.protocol)
  proto = A.protocol
end
if stored[1] then return {tonumber(stored[1]), proto, dedupe, most, codec} end
local want = A.want
if want ~= '1' then
  local left = redis.call('ZCARD', K.scheduled) + redis.call('ZCARD', K.active)
    + redis.call('ZCARD', K.dead)
  if left > 0 then want = '1' end
end
redis.call('HSET', K.shards, 'n', want)
return {tonumber(want), proto, dedupe, most, codec}
