-- dependencies.lua (include): dependencies (docs/dependencies.md).
-- @include chunked
-- @include errors
-- @include events
-- @include levels
-- @include links
-- @include stats
-- @include wake

function links.after_keys(k_waiting, k_after, k_children, k_dead, k_errors, k_ended, bk)
  return {waiting = k_waiting, after = k_after, children = k_children, dead = k_dead,
    errors = k_errors, ended = k_ended, bk = bk}
end

-- How a parent stands when its child is scheduled: 'open' (in the queue, not dead: the child
-- waits), 'ok' (acked: kept as done by keep_results, or gone: nothing of it is left, which is
-- all an acked task leaves without keep_results) or 'failed' with how it ended.
function links.after_parent(ak, k_results, parent)
  local bk = ak.bk
  local k_tasks, k_dead = bk.tasks, ak.dead
  if redis.call('HEXISTS', k_tasks, parent) == 1 then
    if redis.call('ZSCORE', k_dead, parent) then return 'failed', 'dead' end
    return 'open'
  end
  local record = redis.call('HGET', k_results, parent)
  local state = record and string.match(record, '^{"state":"(%a+)"')
  if state and state ~= 'done' then return 'failed', state end
  return 'ok'
end

-- A task stops waiting: out of the waiting set, its after entry and its edges under the
-- parents it still waits for (listed in the entry) dropped.
function links.after_drop(ak, id)
  local k_waiting, k_after, k_children = ak.waiting, ak.after, ak.children
  local v = redis.call('HGET', k_after, id)
  if not v then return end
  local edges = {}
  for parent in string.gmatch(string.match(v, '^%d+|%a|(.*)$') or '', '([^%z]+)') do
    edges[#edges + 1] = parent .. '\0' .. id
  end
  if #edges > 0 then call_chunked('ZREM', k_children, edges) end
  redis.call('HDEL', k_after, id)
  redis.call('ZREM', k_waiting, id)
end

-- Send a waiting child to dead because a parent ended `how`; returns nothing (the caller
-- collects the id).
function links.after_bury(ak, child, parent, how, now)
  local k_dead = ak.dead
  links.after_drop(ak, child)
  redis.call('ZADD', k_dead, now, child)
  local record = cjson.encode({at = now, attempt = 0, type = 'ParentFailed',
    message = 'parent ' .. parent .. ' ended ' .. how})
  error_append(ak.errors, child, record)
  stat_incr(ak.bk.stats, 'dead', 1)
  local k_tasks = ak.bk.tasks  -- an outcome event, written by the script's outcome_events.flush
  outcome_events.note('dead', child, 0, redis.call('HGET', k_tasks, child) or nil, nil, record)
end

-- schedule.lua: a task just added (id) with parents; returns 'run' (put it in its due set as
-- usual), 'wait' (it waits: written here) or 'dead' (a parent had failed, policy "f":
-- buried here).
function links.after_join(ak, k_results, id, parents, policy, due, now)
  local k_children, k_after, k_waiting = ak.children, ak.after, ak.waiting
  local open = {}
  for _, parent in ipairs(parents) do
    local stands, how = links.after_parent(ak, k_results, parent)
    if stands == 'open' and parent ~= id then
      open[#open + 1] = parent
    elseif stands == 'failed' and policy == 'f' then
      links.after_bury(ak, id, parent, how, now)
      return 'dead'
    end
  end
  if #open == 0 then return 'run' end
  for _, parent in ipairs(open) do redis.call('ZADD', k_children, 0, parent .. '\0' .. id) end
  redis.call('HSET', k_after, id, #open .. '|' .. policy .. '|' .. table.concat(open, '\0'))
  redis.call('ZADD', k_waiting, due, id)
  return 'wait'
end

-- The scripts that end tasks: `ids` ended, acked when `ok`, else `how` (dead, cancelled,
-- expired). Releases or buries their waiting children (and the children of those buried, in
-- turn); returns the ids buried here (the caller counts them in their batches).
function links.after_settle(ak, ids, ok, how, now)
  local k_children, k_after, k_waiting = ak.children, ak.after, ak.waiting
  local bk = ak.bk
  local buried, released = {}, 0
  if #ids == 0 or redis.call('EXISTS', k_children) == 0 then return buried end  -- no waiting
  local previous_head = nil
  local todo, i = {}, 1
  for _, id in ipairs(ids) do todo[#todo + 1] = {id, ok, how} end
  while todo[i] do
    local parent, parent_ok, parent_how = todo[i][1], todo[i][2], todo[i][3]
    i = i + 1
    local edges = redis.call('ZRANGEBYLEX', k_children, '[' .. parent .. '\0',
      '[' .. parent .. '\1')
    if #edges > 0 then call_chunked('ZREM', k_children, edges) end
    for _, edge in ipairs(edges) do
      local child = string.sub(edge, #parent + 2)
      local v = redis.call('HGET', k_after, child)
      local n, policy, rest = string.match(v or '', '^(%d+)|(%a)(.*)$')
      n = tonumber(n)
      if n and (parent_ok or policy == 'r') then
        if n > 1 then
          redis.call('HSET', k_after, child, (n - 1) .. '|' .. policy .. rest)
        else
          local due = tonumber(redis.call('ZSCORE', k_waiting, child)) or now
          if due < now then due = now end
          redis.call('ZREM', k_waiting, child)
          redis.call('HDEL', k_after, child)
          local k_tasks = bk.tasks
          local envelope = redis.call('HGET', k_tasks, child)
          if envelope then
            if released == 0 then previous_head = levels_head(bk.levels) end
            local k_level = level_key(bk.levels, envelope)
            redis.call('ZADD', k_level, due, child)
            released = released + 1
            wake_if_earlier(bk.wake, previous_head, due)
          end
        end
      elseif n then
        links.after_bury(ak, child, parent, parent_how, now)
        buried[#buried + 1] = child
        todo[#todo + 1] = {child, false, 'dead'}
      end
    end
  end
  if ak.ended then publish_ended(ak.ended, buried) end
  return buried
end

-- The most dependency edges after_cycle follows for one record (docs/dependencies.md).
links.CYCLE_WALK = 2000  -- 7 to 25 us an edge (HGET + ZSCORE): 15 to 50 ms at the bound

-- The parents a waiting task still waits for: the ids listed in its after entry whose edge to
-- it stands (an acked parent's edge is gone while the list keeps its id).
function links.after_parents_of(ak, id)
  local k_after, k_children = ak.after, ak.children
  local v = redis.call('HGET', k_after, id)
  local parents = {}
  for parent in string.gmatch(string.match(v or '', '^%d+|%a|(.*)$') or '', '([^%z]+)') do
    if redis.call('ZSCORE', k_children, parent .. '\0' .. id) then
      parents[#parents + 1] = parent
    end
  end
  return parents
end

-- schedule.lua, before a task is written with `parents`: whether that would close a cycle,
-- that is whether a parent waits, through waiting tasks, for `id` (so `id` must already have
-- waiting children: only a replaced task can). Returns false, 'cycle', or 'unchecked' when
-- more than links.CYCLE_WALK edges lie on the way (the record is refused then too). Walks the
-- after entries upward from the parents, each task once.
function links.after_cycle(ak, id, parents)
  local k_children = ak.children
  if #redis.call('ZRANGEBYLEX', k_children, '[' .. id .. '\0', '[' .. id .. '\1', 'LIMIT', 0,
    1) == 0 then
    return false
  end
  local seen, todo, walked = {}, {}, 0
  for _, parent in ipairs(parents) do
    if parent ~= id then todo[#todo + 1] = parent end  -- a task that names itself skips it
  end
  while #todo > 0 do
    local node = table.remove(todo)
    if node == id then return 'cycle' end
    if not seen[node] then
      seen[node] = true
      for _, parent in ipairs(links.after_parents_of(ak, node)) do
        walked = walked + 1
        if walked > links.CYCLE_WALK then return 'unchecked' end
        if not seen[parent] then todo[#todo + 1] = parent end
      end
    end
  end
  return false
end

-- cancel.lua, and schedule.lua when it replaces a task: a waiting task stops waiting.
function links.after_forget(ak, id)
  links.after_drop(ak, id)
end
