-- Fencing: the caller holds the lease only if the task is active, its lease has not
-- expired, and the record's token is the one handed out with this claim.
-- Needs: common. k holds active and tasks. Returns header, payload when held, else nil.
local function dq_holds(k, id, token, now)
  local deadline = redis.call('ZSCORE', k.active, id)
  if not deadline or tonumber(deadline) < now then return nil end
  local rec = redis.call('HGET', k.tasks, id)
  if not rec then return nil end
  local h, payload = dq_split(rec)
  if not h or h.t ~= tonumber(token) then return nil end
  return h, payload
end
