-- The attempt alone of a task's attempt state (lib/attempt.lua): claim reads only it.
local function dq_attempt_count(raw)
  return tonumber(string.match(raw, '^%d+ (%d+)')) or 0
end
