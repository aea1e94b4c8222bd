-- history: the dashboard's per-minute counters of one shard (read-only; lib/history.lua
-- writes them).
-- KEYS[1] history
-- ARGV[1] now        ms, or "" for the server's TIME
-- REPLY {now} then per minute {minute, counts}
-- Returns: the server's now (ms), then each minute kept (minutes since the epoch) and its
--          "<succeeded> <discarded> <retried> <dead>[ <bucket>:<count>]..." (delayq/history.py).
--@include clock
local now = dq_now(A.now)
local all = redis.call('HGETALL', K.history)
local out = {now}
for i = 1, #all, 2 do
  if all[i] ~= 'first' then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
