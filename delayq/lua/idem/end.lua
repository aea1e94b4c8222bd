-- idem_end: the request that took an Idempotency-Key (idem_begin) finished: keep its answer
-- for the dedupe window, or free the key when it failed (answer ""), so that the client can
-- send it again. A record that is no longer this request's (expired, taken again) is left.
-- KEYS[1] *record    this key's record (QueueKeys.idempotency), given per call
-- ARGV[1] hash       the request's digest, as idem_begin was given it
-- ARGV[2] answer     3-digit status then the body; "" to free the key
-- ARGV[3] window_ms  the queue's dedupe window (0: nothing is kept)
-- REPLY ok
-- Returns: 1 if the record was this request's, else 0.
if redis.call('GET', K.record) ~= 'p' .. A.hash then
  return 0
end
local window = tonumber(A.window_ms)
if A.answer == '' or window <= 0 then
  redis.call('DEL', K.record)
else
  redis.call('SET', K.record, 'd' .. A.hash .. A.answer, 'PX', window)
end
return 1
