-- Priorities (docs/priorities.md): a waiting task scheduled with a priority 1-9 is in the
-- scheduled set as every task is, and also in the prio index, scored (10 - p) * PRIO_STEP +
-- due, so that each level is one range of scores, its tasks in due order. The control
-- hash's field "prio" is set while the index may hold tasks: claim reads it in the HMGET it
-- makes of the controls anyway, so a queue with no prioritised task pays no command for
-- priorities. The scheduled set stays the truth: claim repairs or drops an index entry
-- that disagrees with it (a task cancelled, or moved by a script that knows no index).

local PRIO_STEP = 1e13  -- ms: past year 2286; (10 - p) * PRIO_STEP + due stays below 2^53

-- A task's score in the index at level p (1-9), due at due (ms).
local function dq_prio_score(p, due)
  return (10 - p) * PRIO_STEP + due
end
