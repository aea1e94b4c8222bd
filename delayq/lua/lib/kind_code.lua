-- Kinds' codes for tombstones (lib/tombstone.lua). k holds kinds.

-- The code of a kind on this shard, given it the first time; codes caches them per call.
local function dq_kind_code(k, kind, codes)
  local c = codes[kind]
  if c then return c end
  c = redis.call('HGET', k.kinds, 'k:' .. kind)
  if not c then
    c = string.format('%d', redis.call('HINCRBY', k.kinds, 'n', 1))
    redis.call('HSET', k.kinds, 'k:' .. kind, c, 'c:' .. c, kind)
  end
  codes[kind] = c
  return c
end
