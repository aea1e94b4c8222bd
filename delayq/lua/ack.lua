-- ack: record tasks as done, if the caller still holds their leases.
-- KEYS[1] active
-- KEYS[2] tasks
-- KEYS[3] done
-- KEYS[4] errors
-- KEYS[5] stats
-- KEYS[6] attempts
-- KEYS[7] xkeys
-- KEYS[8] *history   this ten minutes' hash of the dashboard's history (QueueKeys.history)
-- KEYS[9] results
-- KEYS[10] waits
-- KEYS[11] kinds
-- ARGV[1] now         ms, or "" for the server's TIME
-- ARGV[2] dedupe_ms   keep the finished task this long (0: delete it now)
-- ARGV[3] counter     stats counter to add to: "succeeded" or "discarded"
-- ARGV[4] trim_limit  delete at most this many tasks whose dedupe window has passed
-- ARGV[5] history     ms to keep the history's hash from now (0: keep no history)
-- ARGV[6] lateness    the batch's start lateness: "<bucket>:<count>" pairs (delayq/history.py)
-- ARGV[7] keep        "1": keep the whole record; else a tombstone takes its place
-- ARGV[8] channel     the finished channel: ids someone waits for are published there
-- ARGV[9...] leases   quintuples: id, lease token, the tombstone's first two fields as
--                     "<attempt> <ms from due to finish> " (the worker's; "": from the
--                     attempts entry), kind (for the tombstone; "": read from the record),
--                     result (JSON text; "" for none)
-- REPLY per refused {id}
-- Returns: the ids whose ack was refused because the lease was lost (expired or taken over).
--@include announce
--@include argv
--@include clock
--@include forget
--@include history
--@include kind_code
--@include lease
--@include record
--@include time_text
--@include tombstone
--@include tombstone_read
--@include trim
--@include unwatch
local now = dq_now(A.now)
local dedupe = tonumber(A.dedupe_ms)
local ids, tokens, pres, kinds, results = dq_columns(REST, 5)
local heads, entries = dq_held(K, ids, tokens, now, true)
local refused, acked, scored, na, nr = {}, {}, {}, 0, 0
local tombs, kept, nk = {}, {}, 0
local tombstones = A.keep ~= '1'
local codes = {}  -- kind -> its code, looked up once per call
local stamp = dq_ms(now)  -- the done set's score, formatted once rather than per task
for j, id in ipairs(ids) do
  if heads[j] then
    na = na + 1
    acked[na] = id
    scored[2 * na - 1] = stamp
    scored[2 * na] = id
    if tombstones then
      tombs[2 * na - 1] = id
      local kind = kinds[j]
      local code = codes[kind]
      if not code then
        if kind == '' then
          local h = dq_split(redis.call('HGET', K.tasks, id) or '')
          kind = (h and h.k) or '?'
        end
        code = dq_kind_code(K, kind, codes)
      end
      if pres[j] ~= '' then  -- the worker's: no string work here (the server's one thread)
        tombs[2 * na] = pres[j] .. code
      else
        tombs[2 * na] = dq_tombstone(K, entries[j], now, kind, codes)
      end
    end
    if results[j] ~= '' then
      nk = nk + 2
      kept[nk - 1] = id
      kept[nk] = results[j]
    end
  else
    nr = nr + 1
    refused[nr] = id
  end
end
if na > 0 then
  redis.call('ZREM', K.active, unpack(acked))
  if dedupe > 0 then
    redis.call('ZADD', K.done, unpack(scored))
    if tombstones then
      redis.call('HSET', K.tasks, unpack(tombs))
      redis.call('HDEL', K.attempts, unpack(acked))
    end
    -- A result an earlier run of the same id left (re-created after its window) goes;
    -- a queue whose handlers return nothing has no results hash: the HDEL finds no key.
    -- (Not EXISTS first: the documented least-privilege ACL user is not granted it.)
    if nk < 2 * na then redis.call('HDEL', K.results, unpack(acked)) end
    if nk > 0 then redis.call('HSET', K.results, unpack(kept)) end
  else
    dq_forget(K, acked)
    dq_unwatch(K, acked)
  end
  redis.call('HINCRBY', K.stats, A.counter, na)
  if tombstones and dedupe > 0 then
    dq_announce(K, A.channel, acked, function(j)
      local result = false
      for i = 1, nk, 2 do
        if kept[i] == acked[j] then result = kept[i + 1] end
      end
      return {acked[j], 'done', stamp, dq_tombstone_read(K, tombs[2 * j]), false, false, result}
    end)
  else
    dq_announce(K, A.channel, acked, nil)  -- read with get
  end
end
dq_history(K, now, A.history, A.counter == 'discarded' and 'd' or 's', na, A.lateness)

-- Forget finished tasks whose dedupe window has passed, a few per call.
dq_trim_finished(K, K.done, now - dedupe, tonumber(A.trim_limit))
return refused
