-- The token alone of a task's attempt state (lib/attempt.lua): fencing reads only it.
local function dq_attempt_token(raw)
  return tonumber(string.match(raw, '^%d+'))
end
