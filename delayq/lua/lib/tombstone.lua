--@include kind_code

-- A finished task's tombstone (docs/architecture.md, "Finished tasks"): what get() answers
-- of a done or aborted task once its record is gone, in its place in the tasks hash, so that
-- every version's schedule script still finds the id known for the dedupe window. Stored as
-- "<attempts> <ms from its last due time to its finish> <kind's code>" ("1 3 2"; the middle
-- is empty when the task never ran), the code a number the shard's kinds hash gives each
-- kind, so a tombstone costs a few bytes whatever the kind's length. Scripts reply it with
-- the kind itself in place of the code ("1 3 order.close"). Either form starts with a digit;
-- a record starts with "{". k holds kinds.

-- The tombstone of a task finishing at now. raw: its attempts entry (lib/attempt.lua) or nil.
local function dq_tombstone(k, raw, now, kind, codes)
  local a, d = '0', nil
  if raw then a, d = string.match(raw, '^%d+ (%d+) ?(%S*)$') end
  d = tonumber(d)
  return (a or '0') .. ' ' .. (d and string.format('%d', now - d) or '') .. ' '
    .. dq_kind_code(k, kind, codes)
end
