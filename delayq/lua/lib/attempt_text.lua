-- The attempt state's text (lib/attempt.lua), written.

-- due: the due time as text (a score as Redis returns it, or dq_ms of a number; '' if none).
local function dq_attempt_text(t, a, due)
  return string.format('%d %d %s', t, a, due)
end
