--@include prio

-- The level (1-9) of a score in the prio index (lib/prio.lua).
local function dq_prio_level(score)
  return 10 - math.floor(score / PRIO_STEP)
end
