-- dead_letter.lua (include): the dead-letter set's cap (trim_dead).
-- @include clock
-- @include steps
-- @include tasks

-- Drop dead tasks older than max_age_ms and beyond max_count (bounded work per call), with
-- their durable state when k_steps is given.
local trim_dead
do
  local TRIM_BATCH = 1000
  function trim_dead(k_dead, k_tasks, k_meta, k_errors, now, max_count, max_age_ms, k_steps)
    local trimmed = 0
    local old = redis.call('ZRANGEBYSCORE', k_dead, '-inf', '(' .. ms(now - max_age_ms),
      'LIMIT', 0, TRIM_BATCH)
    for _, id in ipairs(old) do
      forget(k_tasks, k_meta, k_errors, id)
      redis.call('ZREM', k_dead, id)
      trimmed = trimmed + 1
    end
    local excess = redis.call('ZCARD', k_dead) - max_count
    if excess > 0 then
      if excess > TRIM_BATCH then excess = TRIM_BATCH end
      local oldest = redis.call('ZRANGE', k_dead, 0, excess - 1)
      for _, id in ipairs(oldest) do forget(k_tasks, k_meta, k_errors, id) end
      steps_forget(k_steps, oldest)
      redis.call('ZREMRANGEBYRANK', k_dead, 0, excess - 1)
      trimmed = trimmed + #oldest
    end
    steps_forget(k_steps, old)
    return trimmed
  end
end
