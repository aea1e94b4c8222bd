--@include record

-- dq_split for a claim's batch. A producer writes a header as '<fields>,"c":<created>}', or
-- '<fields>,"c":<created>,"h":<headers>}' with headers (codec.record_prefix and
-- encode_headers), and the fields before "c" (kind, max attempts, format) repeat across a
-- queue's tasks: they are decoded once per call, in cache. The header returned is shared
-- between tasks: read it, never change it. Returns header (nil if undecodable), payload,
-- created (nil if unknown), headers (their JSON object as text, undecoded; '' for none).
-- Any other header (fields in another order, an "h" before "c", whitespace, fields after
-- "h") is decoded whole, by dq_split: the same fields, more slowly.
local function dq_split_cached(rec, cache)
  local nl = string.find(rec, '\n', 1, true)
  if not nl then return nil, rec end
  -- The producers' two forms, by plain finds (memchr) and anchored matches: the first ',"c":'
  -- (no JSON string holds one unescaped), then only digits and '}' to the line's end; or
  -- digits, ',"h":{' and an object whose first '}' ends it right before the line's last
  -- (it holds no other, so it is all of "h", and "h" is the last field).
  local pre, c, hs = nil, nil, ''
  local at = string.find(rec, ',"c":', 1, true)
  if at and at < nl then
    local _, e
    _, e, c = string.find(rec, '^(%d+)}\n', at + 5)
    if e then
      pre = string.sub(rec, 1, at - 1)
    else
      _, e, c = string.find(rec, '^(%d+),"h":{', at + 5)
      if e and string.byte(rec, nl - 1) == 125 and string.find(rec, '}', e, true) == nl - 2 then
        pre, hs = string.sub(rec, 1, at - 1), string.sub(rec, e, nl - 2)
      end
    end
  end
  if pre then
    local h = cache[pre]
    if h == nil then
      h = dq_split(pre .. '}\n') or false
      -- Headers among the fields before "c" (another program's order): read whole.
      if h and h.h ~= nil then h = false end
      cache[pre] = h
    end
    local created = tonumber(c)
    if h and dq_finite(created) then return h, string.sub(rec, nl + 1), created, hs end
  end
  local h, payload = dq_split(rec)
  hs = ''
  -- Whatever "h" holds goes to the worker, which refuses anything but an object of strings
  -- (as get() does); null is none. (Encoding fails on what cjson decodes but cannot write,
  -- a number too big for a double, say: undecodable.)
  if h and h.h ~= nil and h.h ~= cjson.null then
    local ok, text = pcall(cjson.encode, h.h)
    if not ok then return nil, payload end
    hs = text
  end
  return h, payload, h and h.c, hs
end
