-- The dashboard's history (QueueKeys.history, delayq/history.py): one field per minute of
-- the server's clock, "<succeeded> <discarded> <retried> <dead>[ <bucket>:<count>]...", the
-- outcomes written in that minute and their lateness histogram, merged with this call's.
-- One HMGET and one HSET per call, whatever its batch. A minute's first write also forgets
-- the minutes that left the window (HDEL, in chunks: at most the window's minutes exist) and
-- sets the key to expire one minute after the window, so a shard no worker writes any more
-- (after a reshard, say) is gone a window later.
-- slot: 1 succeeded, 2 discarded, 3 retried, 4 dead; n: how many; late: the batch's
-- lateness histogram as the worker sends it, "<bucket>:<count>" pairs ("" for none);
-- minutes: the window (0: keep no history). k holds history.
local function dq_history(k, now, minutes, slot, n, late)
  minutes = tonumber(minutes) or 0
  if minutes <= 0 or (n == 0 and late == '') then return end
  local m = math.floor(now / 60000)
  local got = redis.call('HMGET', k.history, 'first', m)
  local c, b, at = {0, 0, 0, 0}, {}, {}
  local old = got[2]
  if old then
    local i = 0
    for w in string.gmatch(old, '%S+') do
      i = i + 1
      if i <= 4 then
        c[i] = tonumber(w) or 0
      else
        local j, count = string.match(w, '^(%d+):(%d+)$')
        if j then
          j = tonumber(j)
          if not b[j] then at[#at + 1] = j end
          b[j] = (b[j] or 0) + tonumber(count)
        end
      end
    end
  end
  c[slot] = c[slot] + n
  for j, count in string.gmatch(late, '(%d+):(%d+)') do
    j = tonumber(j)
    if not b[j] then at[#at + 1] = j end
    b[j] = (b[j] or 0) + tonumber(count)
  end
  table.sort(at)
  local out = {c[1], c[2], c[3], c[4]}
  for i = 1, #at do out[4 + i] = at[i] .. ':' .. b[at[i]] end
  local value = table.concat(out, ' ')
  if old then
    redis.call('HSET', k.history, m, value)
    return
  end
  local first = math.min(tonumber(got[1]) or m, m)
  local keep = m - minutes + 1  -- the oldest minute in the window
  if first < keep then
    -- Fields exist only from first to first + minutes - 1 (every write moved first up).
    local last = math.min(keep - 1, first + minutes - 1)
    for from = first, last, 1000 do
      local gone = {}
      for j = from, math.min(last, from + 999) do gone[#gone + 1] = j end
      redis.call('HDEL', k.history, unpack(gone))
    end
    first = keep
  end
  redis.call('HSET', k.history, m, value, 'first', first)
  redis.call('PEXPIRE', k.history, (minutes + 1) * 60000)
end
