-- move_fields: the home shard's hashes (cron schedules, watched keys, the expiry watcher's
-- mode) leaving or arriving when operate.reshard moves the home shard (from an unsplit queue
-- to shard 0 of a split one, or back).
-- KEYS[1] cron
-- KEYS[2] xkeys
-- KEYS[3] expiry
-- ARGV[1] mode   "read": one HSCAN step of the hash; "put": set the pairs; "drop": delete
--                the fields
-- ARGV[2] which  "cron", "xkeys" or "expiry"
-- ARGV[3...] items  read: cursor, count; put: field, value pairs; drop: fields
-- REPLY {cursor, pairs} | count
-- Returns: read: {next cursor ("0": done), flat field, value pairs}; put and drop: how many
--          fields.
if A.which ~= 'cron' and A.which ~= 'xkeys' and A.which ~= 'expiry' then
  return redis.error_reply('move_fields: unknown hash ' .. tostring(A.which))
end
local hash = K[A.which]
if A.mode == 'read' then
  -- A step at a time, so that no call reads a whole hash of (say) a million watched keys.
  return redis.call('HSCAN', hash, ARGV[REST], 'COUNT', ARGV[REST + 1])
end
local items = {}
for i = REST, #ARGV do items[#items + 1] = ARGV[i] end
if #items == 0 then return 0 end
if A.mode == 'put' then
  redis.call('HSET', hash, unpack(items))
  return #items / 2
elseif A.mode == 'drop' then
  redis.call('HDEL', hash, unpack(items))
  return #items
end
return redis.error_reply('move_fields: unknown mode ' .. tostring(A.mode))
