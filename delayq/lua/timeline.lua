-- timeline: how many waiting tasks fall due in each of the next time buckets (read-only).
-- KEYS[1] scheduled
-- ARGV[1] now        ms, or "" for the server's TIME
-- ARGV[2] bucket_ms  width of one bucket
-- ARGV[3] buckets    how many buckets (the caller keeps this small)
-- REPLY {now, overdue} then per bucket {count} then {later}
-- Returns: {now, overdue (due by now), count of bucket 1, ..., count of bucket N, later};
--          bucket i holds due times in (now + (i-1) * bucket_ms, now + i * bucket_ms].
--@include clock
local now = dq_now(A.now)
local width = tonumber(A.bucket_ms)
local n = tonumber(A.buckets)
local out = {now, redis.call('ZCOUNT', K.scheduled, '-inf', now)}
for i = 1, n do
  out[#out + 1] = redis.call('ZCOUNT', K.scheduled,
    '(' .. (now + (i - 1) * width), now + i * width)
end
out[#out + 1] = redis.call('ZCOUNT', K.scheduled, '(' .. (now + n * width), '+inf')
return out
