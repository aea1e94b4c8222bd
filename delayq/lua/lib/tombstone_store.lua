--@include kind_code

-- Tombstones moved between shards (lib/tombstone.lua). k holds kinds.
-- A tombstone as replied (kind in full) stored again, on this shard (delayq reshard).
local function dq_tombstone_store(k, value, codes)
  local head, kind = string.match(value, '^(%d+ %-?%d* )(.*)$')
  if not head then return value end
  return head .. dq_kind_code(k, kind, codes)
end
