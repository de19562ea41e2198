-- levels.lua (include): priorities (a due ZSET per level) and a stored envelope's options.

-- The lowest score of a ZSET, or nil when it is empty.
local function head_score(k_zset)
  local head = redis.call('ZRANGE', k_zset, 0, 0, 'WITHSCORES')
  if head[2] then return tonumber(head[2]) end
  return nil
end

-- Priorities. A scheduled task waits in the due ZSET of its priority: level 0 is the queue's
-- due key, levels 1 to 9 come as the last nine KEYS of every script that touches scheduled
-- tasks (keys.py upper_due). A task's priority is kept in its envelope's version-2 head
-- "2:<priority>|<timeout ms>|<max attempts>|<key>\n" (envelope.py); version 1 means none.
local function due_levels(k_due0)
  local t = {[0] = k_due0}
  for p = 1, 9 do t[p] = KEYS[#KEYS - 9 + p] end
  return t
end

-- The options of a stored envelope's head (task_options and task_key below); the helpers that
-- split a head's key field are local to them.
local task_options, task_key
do
  -- A head's key field as the limit key and the fair key (each nil when unset): a task with a
  -- fair_key keeps it after the unit separator, "<key>\31<fair key>" (envelope.py).
  local function key_parts(field)
    local cut = string.find(field, '\31', 1, true)
    if not cut then return field ~= '' and field or nil, nil end
    local key, fair_key = string.sub(field, 1, cut - 1), string.sub(field, cut + 1)
    return key ~= '' and key or nil, fair_key ~= '' and fair_key or nil
  end

  -- Priority, max attempts (or nil) and limit key (or nil) of a stored envelope; a missing or
  -- unreadable head counts as none (priority 0), so corrupted options never stop a claim. A
  -- version-3 head ("3:<priority>|<timeout ms>|<max attempts>|<expires ms>|<key>\n", a task
  -- with an expiry: see the expiry notes) holds the same options. The fourth value is the fair
  -- key (or nil).
  function task_options(envelope)
    local head = envelope and string.sub(envelope, 1, 2)
    local p, m, field = nil, nil, nil
    if head == '2:' then
      p, m, field = string.match(envelope, '^2:(%d)|%d*|(%d*)|([^\n]*)\n')
    elseif head == '3:' then
      p, m, field = string.match(envelope, '^3:(%d)|%d*|(%d*)|%d*|([^\n]*)\n')
    end
    if not p then return 0, nil, nil, nil end
    local attempts = tonumber(m)
    if attempts and attempts < 1 then attempts = nil end
    local key, fair_key = key_parts(field)
    return tonumber(p), attempts, key, fair_key
  end

  -- The key field of a stored envelope's head, or nil (no head, or an empty field).
  local function key_field(envelope)
    local b = envelope and string.byte(envelope, 1)
    local field = nil
    if b == 50 then
      field = string.match(envelope, '^2:%d|%d*|%d*|([^\n]*)\n')
    elseif b == 51 then
      field = string.match(envelope, '^3:%d|%d*|%d*|%d*|([^\n]*)\n')
    end
    if field and field ~= '' then return field end
    return nil
  end

  -- The limit key of a stored envelope, or nil (task_options' third value, found faster).
  function task_key(envelope)
    local field = key_field(envelope)
    if field and string.find(field, '\31', 1, true) then return (key_parts(field)) end
    return field
  end
end

-- The due ZSET a stored envelope's task waits in.
local function level_key(levels, envelope)
  local p = task_options(envelope)
  return levels[p]
end

-- Whether any due ZSET of priorities 1 to 9 holds tasks (one call, so that a queue without
-- priorities pays one command, not nine, where a script looks at every level).
local function upper_levels_used(levels)
  return redis.call('EXISTS', unpack(levels, 1, 9)) > 0
end

-- The earliest score over every priority level (only level 0 when `base_only`), or nil when
-- all are empty. Without `base_only`, one EXISTS tells whether the upper levels need reading
-- (a queue without priorities pays two commands, not ten).
local function levels_head(levels, base_only)
  if base_only == nil then base_only = not upper_levels_used(levels) end
  local best = nil
  for p = 0, base_only and 0 or 9 do
    local h = head_score(levels[p])
    if h and (not best or h < best) then best = h end
  end
  return best
end
