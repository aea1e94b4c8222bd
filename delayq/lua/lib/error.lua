-- Errors are kept short enough to read in a dashboard, long enough for a traceback.
local function dq_set_error(errors, id, text)
  if string.len(text) > 8192 then text = string.sub(text, 1, 8192) .. '...' end
  redis.call('HSET', errors, id, text)
end
