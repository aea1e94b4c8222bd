-- Admission controls read by claim (and control): pause and the rate limit's token bucket;
-- per-kind rooms are lib/admit.lua's. The control key holds them (keys.py:
-- QueueKeys.control); a shard with none set costs claim one HMGET of an absent key.

-- The controls as of now: nil when none is set (the plain path), else {paused, limit (the
-- claim's limit, cut to the whole tokens in the bucket), rate (tokens per ms), tokens}.
-- The bucket refills on the server's clock (now); it is written only when tokens are spent.
-- Second: whether the prio index may hold tasks (lib/prio.lua), read by the same HMGET.
local function dq_admit_gate(control, now, limit)
  local c = redis.call('HMGET', control, 'paused', 'rate', 'burst', 'tokens', 'ts', 'prio')
  local prio = c[6] and true or false
  if not c[1] and not c[2] then return nil, prio end
  local g = {paused = c[1] and true or false, limit = limit}
  if g.paused then
    g.limit = 0
    return g, prio
  end
  local rate, burst = tonumber(c[2]), tonumber(c[3])
  if rate and burst and rate > 0 then
    local tokens = tonumber(c[4]) or burst
    local ts = tonumber(c[5]) or now
    if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate) end
    g.rate, g.tokens = rate, tokens
    local whole = math.floor(tokens + 1e-9)  -- a refill's rounding is no token short
    if whole < limit then g.limit = whole end
  end
  return g, prio
end
