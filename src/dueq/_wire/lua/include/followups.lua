-- followups.lua (include): debounce: a run's follow-up starting when the run ends.
-- @include chunked
-- @include levels
-- @include stats
-- @include steps
-- @include wake

-- The runs of `ids` ended (acked, expired, or dead): each one's follow-up, if it has one,
-- becomes the task (attempts from 0; a dead run leaves the dead set, as replace=True would
-- take it out), due at its due time or now; other entries are dropped. Counts them as
-- scheduled and tells the wake channel (k.wake may be nil) of an earlier head.
-- k: {debounce, tasks, meta, errors, stats, wake (or nil), dead (or nil), steps (or nil: a
-- follow-up of a durable task starts from its first step, the ended run's steps dropped)}.
local function followups_start(k, levels, ids, now)
  local k_debounce, k_tasks, k_meta, k_errors, k_dead = k.debounce, k.tasks, k.meta, k.errors,
    k.dead
  if #ids == 0 or redis.call('EXISTS', k_debounce) == 0 then return end
  local entries = hmget_chunked(k_debounce, ids)
  local previous_head = k.wake and levels_head(levels)
  local earliest, started = nil, 0
  for i, id in ipairs(ids) do
    local entry = entries[i]
    if entry then
      local cap, due, from = string.match(entry, '^(%d*)|(%d+)|()')
      if cap then
        local envelope = string.sub(entry, from)
        due = math.max(tonumber(due), now)
        if k_dead then redis.call('ZREM', k_dead, id) end
        redis.call('HDEL', k_meta, id)
        redis.call('HDEL', k_errors, id)
        steps_forget(k.steps, {id})
        redis.call('HSET', k_tasks, id, envelope)
        local k_level = level_key(levels, envelope)
        redis.call('ZADD', k_level, due, id)
        if cap ~= '' then redis.call('HSET', k_debounce, id, cap) end
        if cap == '' then redis.call('HDEL', k_debounce, id) end
        if not earliest or due < earliest then earliest = due end
        started = started + 1
      else
        redis.call('HDEL', k_debounce, id)
      end
    end
  end
  if started > 0 then stat_incr(k.stats, 'scheduled', started) end
  if earliest and k.wake then wake_if_earlier(k.wake, previous_head, earliest) end
end
