-- A record header's priority when it is one of 1-9, else nil.
local function dq_prio_of(h)
  local p = h and tonumber(h.p)
  if p and p >= 1 and p <= 9 and p % 1 == 0 then return p end
  return nil
end
