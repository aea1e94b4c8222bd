-- The dashboard's history (delayq/history.py): a hash of ten minutes (k.history, named by
-- the worker) counts the outcomes of each minute of `now` and their start lateness. One HINCRBY
-- for the count and one per lateness bucket that occurred in the batch, whatever its size:
-- the server does the arithmetic (Lua formats and parses numbers slowly). The first count
-- of a kind in a minute (re)sets the hash's expiry: ttl ms from now, the end of its ten
-- minutes plus the window, so it needs no trimming.
-- slot: "s" succeeded, "d" discarded, "r" retried, "x" dead; n: how many (0: nothing is
-- written); late: the batch's lateness histogram as the worker sends it, "<bucket>:<count>"
-- pairs ("" for none); ttl: "0" keeps no history. k holds history.
local function dq_history(k, now, ttl, slot, n, late)
  if n == 0 or ttl == '0' then return end
  local p = math.floor(now / 60000) .. ':'
  if redis.call('HINCRBY', k.history, p .. slot, n) == n then
    redis.call('PEXPIRE', k.history, ttl)
  end
  for j, c in string.gmatch(late, '(%d+):(%d+)') do
    redis.call('HINCRBY', k.history, p .. j, c)
  end
end
