-- Tombstones as scripts reply them (lib/tombstone.lua). k holds kinds.
-- A stored value as scripts reply it: a tombstone with its kind in place of the code; a
-- record (or false) as it is.
local function dq_tombstone_read(k, value)
  if not value or not string.find(value, '^%d') then return value end
  local head, c = string.match(value, '^(%d+ %-?%d* )(%d+)$')
  if not head then return value end
  return head .. (redis.call('HGET', k.kinds, 'c:' .. c) or '?')
end
