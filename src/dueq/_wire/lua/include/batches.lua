-- batches.lua (include): batches (docs/batches.md).
-- @include chunked
-- @include clock
-- @include levels
-- @include links
-- @include stats
-- @include wake

-- Batches (docs/batches.md). The batches HASH keeps one record per batch:
-- "total|acked|dead|cancelled|expired|created_ms|closed_ms|completed_ms" (closed_ms and
-- completed_ms empty until then), then "|1" when its completion task was not scheduled
-- because a task with its id existed when the batch completed (close_batch.lua refuses an id
-- taken when it closes; one scheduled after the close is found here). schedule.lua makes a task a member when it adds it (an id
-- that already existed is never counted twice) and keeps id -> batch in batch:of, so a task
-- without a batch costs nothing. The scripts that end a task (ack, fail and claim to dead,
-- cancel, expiry) call batch_settle: it removes the id from batch:of and counts the outcome.
-- Once the batch is closed (close_batch.lua) and nothing is pending, the script that sees it
-- (the one settling the last member, or close_batch.lua) schedules the completion task kept in
-- batch:on, exactly once (the field is deleted as it is scheduled; completed_ms is set). A
-- completed batch's record is kept BATCH_KEEP_MS, then dropped by the next script that
-- completes a batch (at most BATCH_TRIM per call); a batch never closed is kept until it is.
links.BATCH_KEEP_MS = 7 * 86400000
links.BATCH_TRIM = 100
links.BATCH_OUTCOMES = {acked = 2, dead = 3, cancelled = 4, expired = 5}

-- A batch record as a list {total, acked, dead, cancelled, expired, created, closed|false,
-- completed|false, completion taken (1)|nil}, or nil when there is none (unreadable counts
-- read as 0).
function links.batch_parse(v)
  if not v then return nil end
  local b, i = {}, 0
  for part in string.gmatch(v .. '|', '([^|]*)|') do
    i = i + 1
    b[i] = tonumber(part) or (i <= 6 and 0 or false)
  end
  for j = i + 1, 8 do b[j] = j <= 6 and 0 or false end
  return b
end

function links.batch_text(b)
  return table.concat({ms(b[1]), ms(b[2]), ms(b[3]), ms(b[4]), ms(b[5]), ms(b[6]),
    b[7] and ms(b[7]) or '', b[8] and ms(b[8]) or ''}, '|') .. (b[9] == 1 and '|1' or '')
end

-- The keys batch_settle and batch_finish use (levels: due_levels of the script's KEYS).
function links.batch_keys(k_batches, k_of, k_on, k_ended, levels, k_tasks, k_stats, k_wake)
  return {batches = k_batches, of = k_of, on = k_on, ended = k_ended, levels = levels,
    tasks = k_tasks, stats = k_stats, wake = k_wake}
end

-- When batch record b is closed and has no member pending, schedule its completion task (a
-- schedule.lua record, '>BdHc0I4c0') unless its id exists (then b notes it, and Redis's log
-- says so), and mark b completed (b changes; the caller writes it). Completed batches older than BATCH_KEEP_MS are dropped here.
function links.batch_finish(bk, batch, b, now)
  if not b[7] or b[8] or b[1] - b[2] - b[3] - b[4] - b[5] > 0 then return end
  local k_on, k_tasks, k_ended, k_batches = bk.on, bk.tasks, bk.ended, bk.batches
  b[8] = now
  local record = redis.call('HGET', k_on, batch)
  if record then
    redis.call('HDEL', k_on, batch)
    local flags, due, id, envelope = struct.unpack('>BdHc0I4c0', record)
    if flags % 2 == 0 then due = now + due elseif due < now then due = now end
    if redis.call('HSETNX', k_tasks, id, envelope) == 1 then
      local previous = levels_head(bk.levels)
      local k_level = level_key(bk.levels, envelope)
      redis.call('ZADD', k_level, due, id)
      stat_incr(bk.stats, 'scheduled', 1)
      wake_if_earlier(bk.wake, previous, due)
    else
      b[9] = 1
      redis.log(redis.LOG_WARNING, '[dueq] batch ' .. batch .. ' of ' .. k_batches ..
        ' completed, but its completion task ' .. id .. ' was not scheduled: a task with ' ..
        'that id exists')
    end
  end
  local old = redis.call('ZRANGEBYSCORE', k_ended, '-inf', '(' .. ms(now - links.BATCH_KEEP_MS),
    'LIMIT', 0, links.BATCH_TRIM)
  if #old > 0 then
    redis.call('HDEL', k_batches, unpack(old))
    redis.call('ZREM', k_ended, unpack(old))
  end
  redis.call('ZADD', k_ended, now, batch)
end

-- Count the end of tasks `ids` (outcome: acked, dead, cancelled or expired) in their batches,
-- and complete the batches that this leaves closed with nothing pending. One HMGET of
-- batch:of when none of the ids is a member.
function links.batch_settle(bk, ids, outcome, now)
  if #ids == 0 then return end
  local k_of, k_batches = bk.of, bk.batches
  if redis.call('EXISTS', k_of) == 0 then return end  -- no open batch has a member
  local of = hmget_chunked(k_of, ids)
  local members, touched, order = {}, {}, {}
  local slot = links.BATCH_OUTCOMES[outcome]
  for i, id in ipairs(ids) do
    local batch = of[i]
    if batch then
      members[#members + 1] = id
      local b = touched[batch]
      if b == nil then
        b = links.batch_parse(redis.call('HGET', k_batches, batch)) or false
        touched[batch] = b
        if b then order[#order + 1] = batch end
      end
      if b then b[slot] = b[slot] + 1 end
    end
  end
  if #members == 0 then return end
  call_chunked('HDEL', k_of, members)
  for _, batch in ipairs(order) do
    local b = touched[batch]
    links.batch_finish(bk, batch, b, now)
    redis.call('HSET', k_batches, batch, links.batch_text(b))
  end
end

-- schedule.lua's side: whether `batch` still takes members (it has not completed), with the
-- batch records read once per call in `cache`.
function links.batch_takes(k_batches, cache, batch, now)
  local b = cache[batch]
  if b == nil then
    b = links.batch_parse(redis.call('HGET', k_batches, batch)) or {0, 0, 0, 0, 0, now, false, false}
    cache[batch] = b
  end
  return not b[8]
end

-- Write the members schedule.lua added (`joined`: id, batch, id, batch, ...) and their
-- batches' new totals.
function links.batch_join(k_batches, k_of, cache, joined)
  if #joined == 0 then return end
  local counted = {}
  for i = 2, #joined, 2 do
    local batch = joined[i]
    counted[batch] = (counted[batch] or 0) + 1
  end
  call_chunked('HSET', k_of, joined)
  for batch, n in pairs(counted) do
    local b = cache[batch]
    b[1] = b[1] + n
    redis.call('HSET', k_batches, batch, links.batch_text(b))
  end
end
