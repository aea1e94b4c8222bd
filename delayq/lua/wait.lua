-- wait: say that someone waits for a task to finish (queue.wait), and look at it once.
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] dead
-- KEYS[4] done
-- KEYS[5] tasks
-- KEYS[6] errors
-- KEYS[7] attempts
-- KEYS[8] aborted
-- KEYS[9] results
-- KEYS[10] kinds
-- KEYS[11] waits
-- KEYS[12] cancelled
-- ARGV[1] now       ms, or "" for the server's TIME
-- ARGV[2] for_ms    how long the caller waits at most
-- ARGV[3] id
-- REPLY {state, score, record, error, attempt, result} | nil
-- Returns: what get replies. A task still waiting or running is entered in the waits set
-- until now + for_ms, so that the script finishing it publishes its id on the finished
-- channel (lib/announce.lua); entries whose time has passed leave the set here, up to 100
-- a call.
--@include clock
--@include lookup
--@include time_text
local now = dq_now(A.now)
-- Entries whose time has passed, a few per call (ZRANGEBYSCORE and ZREM: the documented
-- least-privilege ACL user has no ZREMRANGEBYSCORE).
local passed = redis.call('ZRANGEBYSCORE', K.waits, '-inf', '(' .. dq_ms(now), 'LIMIT', 0, 100)
if #passed > 0 then redis.call('ZREM', K.waits, unpack(passed)) end
local row = dq_lookup(K, A.id)
if row and (row[1] == 'scheduled' or row[1] == 'active') then
  redis.call('ZADD', K.waits, 'GT', dq_ms(now + tonumber(A.for_ms)), A.id)
end
return row
