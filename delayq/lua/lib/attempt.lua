-- A task's attempt state: the lease token, attempt number and due time of its current or
-- last claim, kept in the attempts hash as "<token> <attempt> <due>" apart from the record,
-- so that a claim writes these few bytes instead of rewriting the record. Only these
-- functions and those of lib/attempt_token.lua, attempt_count.lua and attempt_text.lua read
-- or write that text.
local function dq_attempt_parse(raw)
  local t, a, d = string.match(raw, '^(%d+) (%d+) ?(%S*)$')
  return tonumber(t) or 0, tonumber(a) or 0, tonumber(d)
end

-- One task's attempt state: token, attempt, due (see dq_attempt_parse); nil when it has
-- none (never claimed). k holds attempts.
local function dq_attempt(k, id)
  local raw = redis.call('HGET', k.attempts, id)
  if raw then return dq_attempt_parse(raw) end
  return nil
end
