-- debounce.lua (include): debounced schedules (schedule.lua).
-- @include clock

-- Debounce (issue 29). The debounce HASH (keys.py) holds, per debounced id, "<cap ms>" (the
-- latest due time repeated schedules may move it to: the first schedule + max_wait; empty
-- for no bound), and while the task runs (leased, or waiting for a retry of a run) the one
-- follow-up that schedules made meanwhile: "<cap ms>|<due ms>|<envelope>". The follow-up
-- replaces the task when its run ends (ack, dead, expired: followups_start), due at its
-- due time or then, whichever is later. A lease is never revoked by a debounced schedule.

-- A debounced task that was just added: remember its cap; its due time (capped).
local function debounce_start(k_debounce, id, now, due, max_wait)
  if max_wait < 0 then
    redis.call('HDEL', k_debounce, id)
    return due
  end
  local cap = now + max_wait
  redis.call('HSET', k_debounce, id, ms(cap))
  return math.min(due, cap)
end

-- A debounced schedule of a task that runs: keep (or update) its one follow-up; true if so
-- (false: the task does not run and has no follow-up, so the caller replaces it in place).
local function debounce_follow(k_debounce, k_leased, id, envelope, now, due, max_wait)
  local entry = redis.call('HGET', k_debounce, id)
  local cap, pending = nil, false
  if entry then
    local c, fdue = string.match(entry, '^(%d*)|(%d+)|')
    pending = fdue ~= nil
    if pending then cap = tonumber(c) end
  end
  if not pending then
    if not redis.call('ZSCORE', k_leased, id) then return false end
    if max_wait >= 0 then cap = now + max_wait end
  end
  if cap and due > cap then due = math.max(cap, now) end
  redis.call('HSET', k_debounce, id, (cap and ms(cap) or '') .. '|' .. ms(due) .. '|' .. envelope)
  return true
end

-- A debounced schedule replacing a task in place (not running): its due time, capped by the
-- cap of its first debounced schedule (or a new cap from now).
local function debounce_due(k_debounce, id, now, due, max_wait)
  local cap = tonumber(string.match(redis.call('HGET', k_debounce, id) or '', '^(%d+)$'))
  if not cap then
    if max_wait < 0 then return due end
    cap = now + max_wait
    redis.call('HSET', k_debounce, id, ms(cap))
  end
  return math.max(math.min(due, cap), now)
end
