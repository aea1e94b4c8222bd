-- settings: set the settings every producer of a queue follows (`delayq settings`,
-- Queue.update_settings), beside its shard count and protocol version, and read them back.
-- KEYS[1] shards
-- ARGV[1] dedupe_ms    the dedupe window in ms, or "" to leave it as it is
-- ARGV[2] max_payload  the largest encoded payload in bytes, or "" to leave it
-- ARGV[3] codec        "json" or "msgpack", or "" to leave it
-- REPLY {dedupe_ms, max_payload, codec} | status
-- Returns: the settings as stored after the call ("" for one never stored: the defaults
-- apply); status -1 while the queue is being resharded (field "moving"): nothing is written.
-- The values are checked by the caller (delayq/settings.py); shards.lua reads them.
if redis.call('HEXISTS', K.shards, 'moving') == 1 then return -1 end
for _, field in ipairs({'dedupe_ms', 'max_payload', 'codec'}) do
  local value = A[field]
  if value ~= '' then redis.call('HSET', K.shards, field, value) end
end
local stored = redis.call('HMGET', K.shards, 'dedupe_ms', 'max_payload', 'codec')
return {stored[1] or '', stored[2] or '', stored[3] or ''}
