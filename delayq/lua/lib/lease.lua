-- The lease token in a record's header, or nil: for calls that keep the record as it is
-- (ack, extend), which need not copy the payload nor check the header's other fields.
local function dq_token(rec)
  local nl = string.find(rec, '\n', 1, true)
  if not nl then return nil end
  local ok, h = pcall(cjson.decode, string.sub(rec, 1, nl - 1))
  if not ok or type(h) ~= 'table' then return nil end
  return tonumber(h.t) or 0
end

-- Fencing, for a batch: the caller holds a task's lease only if the task is active, the
-- lease has not expired, and the record's token is the one handed out with this claim.
-- One ZMSCORE and one HMGET for the whole batch. With consumes (ack, retry, bury, release),
-- an id repeated in the batch is held only the first time, as if the calls ran one by one.
-- With token_only (ack, extend: the record is not rewritten), only the token is read.
-- Needs: common. k holds active and tasks.
-- Returns, per id: its header (true with token_only; false when the lease is not held), and
-- its payload (false with token_only).
local function dq_held(k, ids, tokens, now, consumes, token_only)
  local heads, payloads, seen = {}, {}, {}
  if #ids == 0 then return heads, payloads end
  local deadlines = redis.call('ZMSCORE', k.active, unpack(ids))
  local recs = redis.call('HMGET', k.tasks, unpack(ids))
  for j = 1, #ids do
    local h, p = nil, nil
    if deadlines[j] and tonumber(deadlines[j]) >= now and recs[j] then
      if token_only then
        h = dq_token(recs[j]) == tonumber(tokens[j]) or nil
      else
        h, p = dq_split(recs[j])
        if h and h.t ~= tonumber(tokens[j]) then h = nil end
      end
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
