-- tasks.lua (include): a task's data, added and dropped.
-- @include stats

local function forget(k_tasks, k_meta, k_errors, id)
  redis.call('HDEL', k_tasks, id)
  redis.call('HDEL', k_meta, id)
  redis.call('HDEL', k_errors, id)
end

-- Add one task due at due_ms unless the id exists in any state; true if it was added.
local function add_task(k_tasks, k_due, k_stats, id, envelope, due_ms)
  if redis.call('HSETNX', k_tasks, id, envelope) == 0 then return false end
  redis.call('ZADD', k_due, due_ms, id)
  stat_incr(k_stats, 'scheduled', 1)
  return true
end
