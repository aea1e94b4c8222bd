-- Fencing, for a batch: the caller holds a task's lease only if the task is active, the
-- lease has not expired, and the record's token is the one handed out with this claim.
-- One ZMSCORE and one HMGET for the whole batch. With consumes (ack, retry, bury, release),
-- an id repeated in the batch is held only the first time, as if the calls ran one by one.
-- Needs: common. k holds active and tasks.
-- Returns, per id: its header (or false when the lease is not held), and its payload.
local function dq_held(k, ids, tokens, now, consumes)
  local heads, payloads, seen = {}, {}, {}
  if #ids == 0 then return heads, payloads end
  local deadlines = redis.call('ZMSCORE', k.active, unpack(ids))
  local recs = redis.call('HMGET', k.tasks, unpack(ids))
  for j = 1, #ids do
    local h, p = nil, nil
    if deadlines[j] and tonumber(deadlines[j]) >= now and recs[j] then
      h, p = dq_split(recs[j])
      if h and h.t ~= tonumber(tokens[j]) then h = nil end
      if h and consumes then
        if seen[ids[j]] then h = nil end
        seen[ids[j]] = true
      end
    end
    heads[j] = h or false
    payloads[j] = p or false
  end
  return heads, payloads
end

-- The variadic tail as columns: dq_columns(REST, 2) -> {ids}, {tokens}.
local function dq_columns(first, stride)
  local cols = {}
  for c = 1, stride do cols[c] = {} end
  for i = first, #ARGV, stride do
    for c = 1, stride do cols[c][#cols[c] + 1] = ARGV[i + c - 1] end
  end
  return unpack(cols)
end

-- The same check for calls that keep the record as it is (ack, extend): only the token is
-- read from the header, which spares copying the payload and checking the header's other
-- fields (nothing here writes them back). Returns, per id, whether the lease is held.
local function dq_holds(k, ids, tokens, now, consumes)
  local held, seen = {}, {}
  if #ids == 0 then return held end
  local deadlines = redis.call('ZMSCORE', k.active, unpack(ids))
  local recs = redis.call('HMGET', k.tasks, unpack(ids))
  for j = 1, #ids do
    local ok, rec = false, recs[j]
    if deadlines[j] and tonumber(deadlines[j]) >= now and rec then
      local nl = string.find(rec, '\n', 1, true)
      if nl then
        local decoded, h = pcall(cjson.decode, string.sub(rec, 1, nl - 1))
        ok = decoded and type(h) == 'table' and (tonumber(h.t) or 0) == tonumber(tokens[j])
      end
      if ok and consumes then
        ok = not seen[ids[j]]
        seen[ids[j]] = true
      end
    end
    held[j] = ok
  end
  return held
end
