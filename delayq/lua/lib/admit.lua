--@include record_cached

-- Admission by kind, for claim: per-kind rooms, and what the claim's reply reports
-- (lib/admit_gate.lua reads the controls).

-- Rows a claim with rooms looks at past its limit, for other kinds' tasks behind those of a
-- kind whose room is used up.
local ADMIT_SCAN = 100

-- The rooms of ARGV's tail (pairs "kind room", from index rest), or nil when there are none.
local function dq_admit_rooms(rest)
  if #ARGV < rest then return nil end
  local rooms = {}
  for i = rest, #ARGV - 1, 2 do rooms[ARGV[i]] = tonumber(ARGV[i + 1]) end
  return rooms
end

-- Keep, in order, at most limit of the rows read (ids, their ZRANGEBYSCORE pairs and their
-- records), skipping the tasks of a kind whose room is used up (a row whose record cannot be
-- decoded is kept: claim buries it). Returns ids, pairs, records, how many were skipped, and
-- whether the look was cut short (every row read was looked at and there may be more due).
local function dq_admit_kinds(ids, due, recs, rooms, limit, scan, cache)
  local kids, kdue, krecs, n, skipped = {}, {}, {}, 0, 0
  local looked = true
  for j, id in ipairs(ids) do
    if n >= limit then
      looked = false
      break
    end
    local rec = recs[j]
    local h = rec and dq_split_cached(rec, cache)
    local room = h and rooms[h.k]
    if room and room <= 0 then
      skipped = skipped + 1
    else
      if room then rooms[h.k] = room - 1 end
      n = n + 1
      kids[n] = id
      kdue[2 * n - 1] = id
      kdue[2 * n] = due[2 * j]
      krecs[n] = rec
    end
  end
  return kids, kdue, krecs, skipped, looked and #ids >= scan
end

-- After a claim: spend the tokens taken, and return what the reply reports: the head (false:
-- none the worker should wait for) and next_token (-1: none).
local function dq_admit_reply(k, g, now, horizon, head, taken, skipped, cut)
  if g and g.paused then return false, -1 end
  if skipped > 0 then
    if cut then
      head = false
    else
      local first = redis.call('ZRANGE', k.scheduled, skipped, skipped, 'WITHSCORES')
      head = first[2] and tonumber(first[2])
    end
  end
  local next_token = -1
  if g and g.rate then
    if taken > 0 then
      g.tokens = g.tokens - taken
      redis.call('HSET', k.control, 'tokens', string.format('%.17g', g.tokens),
        'ts', string.format('%d', now))
    end
    local waiting = head and head <= horizon
    if skipped > 0 then waiting = true end
    if waiting and g.tokens + 1e-9 < 1 then
      next_token = now + math.ceil((1 - g.tokens) / g.rate)
    end
  end
  return head, next_token
end
