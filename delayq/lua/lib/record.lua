-- A task's record: "<json header>\n<payload>" (docs/protocol.md, "The record").

-- Whether a header's number can be carried by a reply and written as an integer (%d): not
-- NaN, and within the doubles that hold every integer exactly (2^53).
local function dq_finite(v)
  return v == nil or (v == v and v < 9007199254740992 and v > -9007199254740992)
end

-- A record is "<json header>\n<payload>". Returns header table (nil if undecodable), payload.
-- A header with a number dq_finite refuses counts as undecodable.
local function dq_split(rec)
  local nl = string.find(rec, '\n', 1, true)
  if not nl then return nil, rec end
  local payload = string.sub(rec, nl + 1)
  local ok, h = pcall(cjson.decode, string.sub(rec, 1, nl - 1))
  if not ok or type(h) ~= 'table' or type(h.k) ~= 'string' then return nil, payload end
  h.m = tonumber(h.m) or 0
  h.c = tonumber(h.c)
  if not (dq_finite(h.m) and dq_finite(h.c)) then return nil, payload end
  return h, payload
end
