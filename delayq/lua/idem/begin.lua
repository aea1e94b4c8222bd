-- idem_begin: a request with an Idempotency-Key (the HTTP API) starts: it takes the key, or
-- learns why not. The record is 'p' .. hash while the key's first request runs, then
-- 'd' .. hash .. answer (idem_end) for the dedupe window.
-- KEYS[1] *record    this key's record (QueueKeys.idempotency), given per call
-- ARGV[1] hash       the request's digest (64 hex characters: the route and the body)
-- ARGV[2] pending_ms how long a request that never finishes holds the key
-- REPLY {state, answer}
-- Returns: {state, answer}. state "new": the key is this request's now (answer ""); "pending":
-- a request with this key and body is running; "done": one finished, and answer is its
-- answer (3-digit status, then the body); "mismatch": the key was used with another request.
local record = redis.call('GET', K.record)
if not record then
  redis.call('SET', K.record, 'p' .. A.hash, 'PX', tonumber(A.pending_ms))
  return {'new', ''}
end
if string.sub(record, 2, 65) ~= A.hash then
  return {'mismatch', ''}
end
if string.sub(record, 1, 1) == 'p' then
  return {'pending', ''}
end
return {'done', string.sub(record, 66)}
