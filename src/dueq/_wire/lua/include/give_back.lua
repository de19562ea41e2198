-- give_back.lua (include): leased tasks handed back to due without counting their deliveries
-- (release.lua; step.lua when a durable task sleeps, waits for a signal or retries a step).
-- @include clock
-- @include key_cooldown
-- @include key_limits
-- @include leases
-- @include levels
-- @include meta
-- @include settings
-- @include stats
-- @include wake

-- Hand back the leases `held` (ids whose lease the caller found held), each due at `due`;
-- with hold_ms > 0 each one's limit key is held as long (a KeyCooldown). Their attempt
-- counts go back by one (the delivery is not counted), their keys' leases end (waking
-- consumers a key held), a consumer sleeping at the concurrency cap is told, and one wake
-- goes out when a level's head moved earlier. k: {due, leased, meta, stats, wake, tasks,
-- key_state, key_wait, config, claims} (due: level 0; the levels are the last nine KEYS).
local function give_back(k, held, due, hold_ms, now)
  local k_leased, k_meta, k_wake, k_key_state, k_key_wait = k.leased, k.meta, k.wake, k.key_state,
    k.key_wait
  local levels = due_levels(k.due)
  local k_tasks = k.tasks
  local envelopes = redis.call('HMGET', k_tasks, unpack(held))
  -- the concurrency cap: a consumer may be sleeping capped; tell it a lease ends
  local cap = settings_read(k.config, k.stats, 'concurrency').concurrency
  if cap and at_cap(k_leased, cap, now) then publish_wake(k_wake, ms(now)) end
  local previous_heads, woken = {}, false  -- level key -> its head before these releases
  for i, id in ipairs(held) do
    local envelope = envelopes[i] or nil
    local k_level = level_key(levels, envelope)
    if previous_heads[k_level] == nil then
      previous_heads[k_level] = head_score(k_level) or false
    end
    -- the key this lease is counted in (its meta names it: include/key_state.lua), also
    -- when its data is gone; the task's own key (the envelope's) is the one a cooldown holds
    local counted_key = lease_key(k_meta, id)
    local _, _, key = task_options(envelope)
    if not envelope then  -- its data is gone (evicted, deleted by hand)
      key = counted_key
      redis.log(redis.LOG_WARNING, '[dueq] released lease of ' .. id .. ' had no stored task ' ..
        '(evicted or deleted by hand)' .. (key and '; its key ' .. key .. ' released' or ''))
    end
    if counted_key and key_unlease(k_key_state, k_key_wait, counted_key, now) and not woken then
      publish_wake(k_wake, ms(now))
      woken = true
    end
    -- KeyCooldown (issue 29): hold the task's key until now + the hold
    if key and hold_ms > 0 then key_hold(k_key_state, k_key_wait, key, now + hold_ms, now) end
    meta_unlease(k_meta, k_leased, k.claims, id, -1)
    redis.call('ZREM', k_leased, id)
    redis.call('ZADD', k_level, due, id)
  end
  stat_incr(k.stats, 'released', #held)
  -- one wake for the lot when a level's head moved earlier (wake_if_earlier's rule)
  local earlier = false
  for _, previous_head in pairs(previous_heads) do
    if previous_head == false or due < previous_head then earlier = true end
  end
  if earlier then publish_wake(k_wake, ms(due)) end
end
