-- control: read a shard's admission controls (read-only).
-- KEYS[1] control
-- KEYS[2] scheduled
-- ARGV[1] now  ms, or "" for the server's TIME
-- REPLY {paused, limit, limit_burst, tokens}
-- Returns: paused ("1" or nil), the queue-wide rate limit as set ("100/s"; nil for none)
-- and its burst, and the whole tokens this shard's bucket holds as of now (-1: no limit).
--@include admit_gate
--@include clock
local now = dq_now(A.now)
local c = redis.call('HMGET', K.control, 'paused', 'limit', 'limit_burst')
local tokens = -1
local g = dq_admit_gate(K.control, now, 1e9)
if g and g.rate then tokens = math.floor(g.tokens + 1e-9) end
return {c[1], c[2], c[3], tokens}
