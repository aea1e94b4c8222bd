-- The variadic tail as columns: dq_columns(REST, 2) -> {ids}, {tokens}.
local function dq_columns(first, stride)
  local cols = {}
  for c = 1, stride do cols[c] = {} end
  local n = 0  -- a counter: "#t + 1" costs a search on every insert
  for i = first, #ARGV, stride do
    n = n + 1
    for c = 1, stride do cols[c][n] = ARGV[i + c - 1] end
  end
  return unpack(cols)
end
