-- schedule_records.lua (include): schedule_records, the body of schedule.lua, which
-- spark_commit.lua calls too (its staged records are scheduled by the very code that schedules
-- every other task). It reads the KEYS of schedule.lua's header, in that order (spark_commit.lua
-- passes them first, and the upper due ZSETs last), and ARGV[1], the queue clock.
-- @include batches
-- @include bulk
-- @include clock
-- @include debounce
-- @include dependencies
-- @include expiry
-- @include fair
-- @include key_limits
-- @include levels
-- @include links
-- @include records
-- @include settings
-- @include stats
-- @include steps
-- @include unpark
-- @include wake

-- Add the packed records `blob` (schedule.lua's ARGV[3]) to the queue, replacing tasks that
-- exist when `replace`; `caller_window_ms` is schedule.lua's ARGV[4]. Returns schedule.lua's
-- reply. `fk`: the fair set and the lanes' counts ({lanes =, counts =}, include/fair.lua): on a fair
-- queue the tasks due now go to their lanes.
local function schedule_records(replace, blob, caller_window_ms, k_steps, fk)
  local now = dueq_now(ARGV[1])
  history_use(KEYS[14], ARGV[1])
  local window, settings = done_window(KEYS[10], KEYS[7], caller_window_ms, 'fairness')
  local acked_since = now - window
  local levels = due_levels(KEYS[1])
  local previous_head = levels_head(levels)
  local added, existing, replaced, followed = 0, 0, 0, 0
  local collided = {}
  local written, placed = {}, {}  -- ids written, in order; id -> {level, due} (the last write wins)
  local earliest = nil
  local pos, position = 1, 0
  local batches, joined = {}, {}  -- batch records read (batch_takes), id, batch, ...
  local bk = links.batch_keys(KEYS[16], KEYS[17], KEYS[18], KEYS[19], levels, KEYS[2], KEYS[7],
    KEYS[8])
  local ak = links.after_keys(KEYS[20], KEYS[21], KEYS[22], KEYS[6], KEYS[4], nil, bk)
  local born_dead = {}  -- tasks buried as they were added: a parent had failed
  local laning = settings.fairness == 'key'

  while pos <= #blob do
    local flags, due, id, envelope
    flags, due, id, envelope, pos = struct.unpack('>BdHc0I4c0', blob, pos)
    position = position + 1
    local max_wait = nil  -- debounced records only
    if flags % 8 >= 4 then max_wait, pos = struct.unpack('>d', blob, pos) end
    if flags % 16 >= 8 then envelope = expiry_absolute(envelope, now) end
    local batch, parents
    if flags % 32 >= 16 then batch, pos = struct.unpack('>Hc0', blob, pos) end
    if flags % 64 >= 32 then parents, pos = links.after_unpack(blob, pos) end
    local generated = flags % 4 >= 2
    if flags % 2 == 0 then due = now + due elseif due < now then due = now end
    local write = false
    local acked = false
    local refused = batch and not links.batch_takes(KEYS[16], batches, batch, now)
    if window > 0 and not replace and not max_wait and not refused then
      local at = redis.call('ZSCORE', KEYS[9], id)
      acked = at and tonumber(at) >= acked_since
    end
    local cyclic = false  -- 'cycle' or 'unchecked': written, it would wait for itself
    if parents and not refused and not acked and
      (replace or max_wait or redis.call('HEXISTS', KEYS[2], id) == 0) then
      cyclic = links.after_cycle(ak, id, parents)
    end
    if refused then
      collided[#collided + 1] = -position
    elseif acked then
      if generated then collided[#collided + 1] = position else existing = existing + 1 end
    elseif cyclic then
      collided[#collided + 1] = (cyclic == 'cycle' and 'c' or 'u') .. position
    elseif redis.call('HSETNX', KEYS[2], id, envelope) == 1 then
      added = added + 1
      write = true
      if max_wait then due = debounce_start(KEYS[15], id, now, due, max_wait) end
      if batch then joined[#joined + 1] = id; joined[#joined + 1] = batch end
    elseif generated then
      collided[#collided + 1] = position
    elseif max_wait and debounce_follow(KEYS[15], KEYS[5], id, envelope, now, due, max_wait) then
      followed = followed + 1  -- counted as scheduled when it starts (followups_start)
    elseif replace or max_wait then
      local old = redis.call('HGET', KEYS[2], id)
      local k_old = level_key(levels, old)
      if k_old ~= level_key(levels, envelope) then redis.call('ZREM', k_old, id) end
      local old_priority, _, old_key = task_options(old)
      if redis.call('ZSCORE', KEYS[5], id) then  -- its lease ends here
        local counted_key = lease_key(KEYS[3], id)  -- the key it is counted in (per-key notes)
        if counted_key and key_unlease(KEYS[11], KEYS[13], counted_key, now) then
          publish_wake(KEYS[8], ms(now))
        end
      else  -- it leaves the parked set (or its lane), if it is parked
        unpark_one(KEYS[12], KEYS[11], KEYS[3], old_key, old_priority, id, fk.counts,
          fk.lanes)
      end
      redis.call('ZREM', KEYS[5], id)
      redis.call('ZREM', KEYS[6], id)
      redis.call('HDEL', KEYS[3], id)
      redis.call('HDEL', KEYS[4], id)
      steps_forget(k_steps, {id})  -- a replaced durable task starts from its first step
      redis.call('HSET', KEYS[2], id, envelope)
      replaced = replaced + 1
      write = true
      links.after_forget(ak, id)  -- a waiting task replaced waits for the new record's parents
      if max_wait then due = debounce_due(KEYS[15], id, now, due, max_wait) end
    else
      existing = existing + 1
    end
    if write and parents then
      local stands = links.after_join(ak, KEYS[23], id, parents, flags % 128 >= 64 and 'r' or 'f',
        due, now)
      if stands ~= 'run' then  -- out of its due set (a replaced task was there)
        local k_level = level_key(levels, envelope)
        redis.call('ZREM', k_level, id)
        write = false
        placed[id] = false
      end
      if stands == 'dead' then born_dead[#born_dead + 1] = id end
    end
    if write then
      if placed[id] == nil then written[#written + 1] = id end
      placed[id] = {task_options(envelope), due, laning and fair.tenant(envelope)}
      if earliest == nil or due < earliest then earliest = due end
    end
  end

  if earliest ~= nil then
    local zadd = {}  -- priority -> {score, id, ...}
    local members, metas, counts = {}, {}, {}  -- due now on a fair queue: its lane
    for _, id in ipairs(written) do
      local at = placed[id]  -- false: a later record of the id waits for parents
      local tenant = at and at[3]
      if tenant and at[2] <= now then
        members[#members + 1] = 0
        members[#members + 1] = fair.member(tenant, at[1], at[2], id)
        metas[#metas + 1] = id
        metas[#metas + 1] = fair.meta(0, at[2], '', tenant)
        counts[tenant] = (counts[tenant] or 0) + 1
      elseif at then
        local p, due = at[1], at[2]
        local batch = zadd[p]
        if not batch then batch = {}; zadd[p] = batch end
        batch[#batch + 1] = due
        batch[#batch + 1] = id
      end
    end
    for p, batch in pairs(zadd) do zadd_many(levels[p], batch) end
    if #members > 0 then
      fair.add({meta = KEYS[3], parked = KEYS[12], fair = fk.lanes, due = fk.counts}, members, metas,
        counts)
    end
    stat_incr(KEYS[7], 'scheduled', added + replaced)
    wake_if_earlier(KEYS[8], previous_head, earliest)
  end
  links.batch_join(KEYS[16], KEYS[17], batches, joined)
  links.batch_settle(bk, born_dead, 'dead', now)
  local out = {added, existing, replaced + followed}
  for _, p in ipairs(collided) do out[#out + 1] = p end
  return out
end
