-- A time for a reply or a stored text: a whole ms as an integer, one with microseconds with
-- three decimals (Lua's tostring keeps 14 digits and would round them away).
local function dq_ms(x)
  if x % 1 == 0 then return string.format('%d', x) end
  return string.format('%.3f', x)
end
