-- seek: a page of the tasks in one state after a cursor (keyset paging, read-only). The
-- waiting by due time, the running by lease deadline, the finished by finish time and the
-- aborted by abort time come oldest first; the dead most recent first. The cursor is the (score, id) of the last task
-- of the previous page, so a page costs the same however deep it is: a sharded queue asks
-- each shard for one page after the cursor and merges them (shards.merge_page).
-- KEYS[1] scheduled
-- KEYS[2] active
-- KEYS[3] dead
-- KEYS[4] done
-- KEYS[5] tasks
-- KEYS[6] errors
-- KEYS[7] attempts
-- KEYS[8] aborted
-- KEYS[9] kinds
-- ARGV[1] state   "scheduled", "active", "done", "aborted" (ascending) or "dead" (descending)
-- ARGV[2] score   the cursor's score as a reply gave it; "" for the first page
-- ARGV[3] id      the cursor's id (members of one score are in byte order, as in the set)
-- ARGV[4] limit   at most this many tasks
-- REPLY per task {id, score, record, error, attempt}
-- Returns: flat quintuples, in page order: id, score (ms), record (or false), last error
--          (or false), attempt state (or false: see get.lua).
--@include rows

-- Byte order, as the sorted set orders members of one score (Lua's < follows the locale).
-- Bounded by the shorter string.
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

if A.state ~= 'scheduled' and A.state ~= 'active' and A.state ~= 'done' and A.state ~= 'dead'
  and A.state ~= 'aborted' then
  return redis.error_reply('seek: unknown state ' .. tostring(A.state))
end
local set = K[A.state]
local desc = A.state == 'dead'
local limit = tonumber(A.limit)
local first, last -- ranks, ascending
if A.score == '' then
  if desc then
    local n = redis.call('ZCARD', set)
    first, last = n - limit, n - 1
  else
    first, last = 0, limit - 1
  end
else
  -- The cursor's score holds ranks [lo, hi); find, by bisection (at most 64 steps), the
  -- first of them whose member comes after the cursor's id (descending: is not before it).
  local lo = redis.call('ZCOUNT', set, '-inf', '(' .. A.score)
  local hi = redis.call('ZCOUNT', set, '-inf', A.score)
  for _ = 1, 64 do
    if lo >= hi then break end
    local mid = math.floor((lo + hi) / 2)
    local member = redis.call('ZRANGE', set, mid, mid)[1]
    local past
    if desc then past = not before(member, A.id) else past = before(A.id, member) end
    if past then hi = mid else lo = mid + 1 end
  end
  if desc then first, last = lo - limit, lo - 1 else first, last = lo, lo + limit - 1 end
end
if first < 0 then first = 0 end
if last < first then return {} end
local ids = redis.call('ZRANGE', set, first, last, 'WITHSCORES')
if desc then return dq_rows(K, ids, #ids - 1, 1, -2) end
return dq_rows(K, ids, 1, #ids - 1, 2)
