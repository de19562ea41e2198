-- reshard.lua: move tasks between the shards of a sharded queue whose shard count changes
-- (dueq.sharding.reshard). A task moves in three calls, each atomic on one shard: "take" on
-- the shard that holds it moves its whole state (envelope, due time and priority level or
-- died-at, attempt record, errors, durable steps and signals, debounce cap, kept result, done
-- mark) out of every key into one JSON record in `moving`, so no claim and no operation there
-- sees it; "put" on its new shard writes that record back where it was (a part the new shard
-- already has wins: a producer wrote that id there first) and notes the record's token in
-- `arrived`; "drop" on the old shard deletes the record. A mover killed between the calls
-- left the record in `moving`; the next one puts it again and drops it. A record whose token
-- the new shard noted was put already (its task may have run and ended there since): it is
-- not written again, so a killed mover never brings a finished task back. A task that is leased,
-- in a batch, or waiting for parents is not taken: it stays until it settles. A keyed task
-- moves like any other when its id carries its key's route (its new shard is its key's) and
-- its key has no state here; else it stays ("kept"), claimed where it is.
--
-- KEYS[1] tasks     HASH id -> envelope
-- KEYS[2] meta      HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[3] errors    HASH id -> JSON list of errors
-- KEYS[4] leased    ZSET id -> lease deadline ms
-- KEYS[5] dead      ZSET id -> died-at ms
-- KEYS[6] results   HASH id -> finished record
-- KEYS[7] finished  ZSET id -> finished ms
-- KEYS[8] done      ZSET id -> acked-at ms
-- KEYS[9] steps     HASH "<id>", "<id>\0s", "<id>\0p" -> step log, signals, progress
-- KEYS[10] debounce HASH id -> debounce cap (and follow-up)
-- KEYS[11] batch_of HASH id -> batch id
-- KEYS[12] after    HASH id -> "<parents not finished>|<policy>"
-- KEYS[13] moving   HASH id -> JSON record of a task taken and not yet dropped
-- KEYS[14] wake     Pub/Sub channel, told when a task put here is due
-- KEYS[15] arrived  HASH id -> token of the record put here (until the reshard ends)
-- KEYS[16] cron     HASH name -> cron definition
-- KEYS[17] cron_state HASH name -> "head_ms|last_ms|head_id"
-- KEYS[18] cron_paused HASH name -> paused-at ms
-- KEYS[19] cron_last HASH name -> the outcome of its last firing
-- KEYS[20] cron_runs HASH name -> its runs record (JSON: fired, skipped, run, buffered, ...)
-- KEYS[21] cron_filled ZSET (scores 0) "<name>\0<slot ms>": the slots backfill scheduled
-- KEYS[22] key_state HASH key -> "leased|mark|parked" (include/key_state.lua)
-- KEYS[23] due      ZSET id -> due ms (priority 0)
-- KEYS[24..32] upper_due: the due ZSETs of priorities 1 to 9 (last: include/levels.lua)
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] "take", "take_crons", "put" or "drop"
-- take: ARGV[3..] ids. Returns {leased, kept, id1, record1, id2, record2, ...}: how many were
--       not taken because leased, and because keyed, batched or waiting; then each taken
--       task's id and record (an id with nothing here is left out)
-- take_crons: ARGV[3..] cron definition names. As take: each definition (all its fields and
--       backfilled slots) and its pending occurrence in one record, under "\0cron\0<name>"; a
--       definition whose latest occurrence has not ended here (or has one buffered), or whose
--       pending occurrence is leased, stays (counted kept, or leased)
-- put:  ARGV[3..] pairs id (or "\0cron\0<name>"), record. Returns {put, existing}: tasks
--       (and definitions) written, and tasks (or definitions) whose id this shard had already (their record's task left out; its result or done mark kept
--       when this shard has none); a record put here before (its token in `arrived`) is left
--       out and counted in neither
-- drop: ARGV[3..] ids. Returns the number of records deleted from `moving`
-- @include clock
-- @include levels
-- @include wake

local op = ARGV[2]
local levels = due_levels(KEYS[23])
-- a record's fields: envelope, due ms, level, died-at, meta, errors, step log, signals,
-- progress, debounce, result, finished ms, done ms (each absent when the task has none)
local STEP_FIELDS = {{'', 'log'}, {'\0s', 'signals'}, {'\0p', 'progress'}}

local function hget(k_hash, field)
  local v = redis.call('HGET', k_hash, field)
  if v then return v end
  return nil
end

local function zscore(k_zset, member)
  local v = redis.call('ZSCORE', k_zset, member)
  if v then return v end
  return nil
end

-- Whether id ends in a key's route: "~k" and 16 lowercase hex digits (dueq._wire.envelope's
-- route_ending), so that it lies with its key for every shard count.
local function routed(id)
  return #id > 18 and string.sub(id, -18, -17) == '~k'
    and string.find(string.sub(id, -16), '^[0-9a-f]+$') ~= nil
end

-- The whole state of task `id` here, for a record: nil and why not ('leased', or 'kept': a
-- limit key without its route in the id or with a state here, a batch, parents, parked) when
-- it must stay; nil, nil when it has none.
local function task_state(id)
  local record = {}
  local envelope = hget(KEYS[1], id)
  if envelope then
    local p, _, key = task_options(envelope)
    if redis.call('ZSCORE', KEYS[4], id) then return nil, 'leased' end
    if (key and (not routed(id) or redis.call('HEXISTS', KEYS[22], key) == 1))
        or redis.call('HEXISTS', KEYS[11], id) == 1 or redis.call('HEXISTS', KEYS[12], id) == 1 then
      return nil, 'kept'
    end
    record.due, record.dead = zscore(levels[p], id), zscore(KEYS[5], id)
    if not record.due and not record.dead then return nil, 'kept' end  -- parked, or in a lane
    record.envelope, record.level = envelope, p
    record.meta, record.errors = hget(KEYS[2], id), hget(KEYS[3], id)
    record.debounce = hget(KEYS[10], id)
    for _, f in ipairs(STEP_FIELDS) do record[f[2]] = hget(KEYS[9], id .. f[1]) end
  end
  record.result, record.finished = hget(KEYS[6], id), zscore(KEYS[7], id)
  record.done = zscore(KEYS[8], id)
  if next(record) == nil then return nil, nil end
  return record, nil
end

-- Delete task `id`'s state here (what task_state read into `record`).
local function task_forget(id, record)
  if record.envelope then
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[10], id)
    local k_level = levels[record.level]
    redis.call('ZREM', k_level, id)
    redis.call('ZREM', KEYS[5], id)
    for _, f in ipairs(STEP_FIELDS) do redis.call('HDEL', KEYS[9], id .. f[1]) end
  end
  redis.call('HDEL', KEYS[6], id)
  redis.call('ZREM', KEYS[7], id)
  redis.call('ZREM', KEYS[8], id)
end

-- Write task `id`'s record here unless this shard has the id: 'put' (and its due ms, or
-- nil), 'existing', or nil (a record with no task).
local function task_put(id, record)
  local status, due = nil, nil
  if record.envelope then
    if redis.call('HSETNX', KEYS[1], id, record.envelope) == 1 then
      status = 'put'
      if record.due then
        local k_level = levels[tonumber(record.level)]
        redis.call('ZADD', k_level, record.due, id)
        due = tonumber(record.due)
      end
      if record.dead then redis.call('ZADD', KEYS[5], record.dead, id) end
      if record.meta then redis.call('HSET', KEYS[2], id, record.meta) end
      if record.errors then redis.call('HSET', KEYS[3], id, record.errors) end
      if record.debounce then redis.call('HSET', KEYS[10], id, record.debounce) end
      for _, f in ipairs(STEP_FIELDS) do
        if record[f[2]] then redis.call('HSET', KEYS[9], id .. f[1], record[f[2]]) end
      end
    else
      status = 'existing'
    end
  end
  if record.result and redis.call('HSETNX', KEYS[6], id, record.result) == 1 then
    redis.call('ZADD', KEYS[7], record.finished or dueq_now(ARGV[1]), id)
  end
  if record.done and not redis.call('ZSCORE', KEYS[8], id) then
    redis.call('ZADD', KEYS[8], record.done, id)
  end
  return status, due
end

-- A cron definition's fields (the cron HASHes) and its slots filled by backfill.
local CRON_FIELDS = {{KEYS[16], 'definition'}, {KEYS[17], 'state'}, {KEYS[18], 'paused'},
  {KEYS[19], 'last'}, {KEYS[20], 'runs'}}

-- Whether an occurrence id is one a definition's latest run or buffered occurrence names
-- and that has not ended here (its outcome is still to be noted on this shard).
local function occurrence_live(id)
  return id and (redis.call('HEXISTS', KEYS[1], id) == 1 or redis.call('ZSCORE', KEYS[4], id))
end

if op == 'take' or op == 'take_crons' then
  local leased, kept, out = 0, 0, {}
  local t = redis.call('TIME')  -- the server's: a token differs from every earlier take's
  local token_head = KEYS[13] .. '|' .. t[1] .. '.' .. t[2] .. '|'
  for i = 3, #ARGV do
    local field, record, why = ARGV[i], nil, nil
    if op == 'take' then
      record, why = task_state(field)
      if record then task_forget(field, record) end
    else  -- a definition, with its pending occurrence: they move together, or not at all
      local name = field
      field = '\0cron\0' .. name
      local definition = hget(KEYS[16], name)
      local read, runs = pcall(cjson.decode, hget(KEYS[20], name) or '{}')
      if not read then runs = {} end  -- an unreadable runs record reads as a new one
      local state = hget(KEYS[17], name) or ''
      local head = string.match(state, '^[^|]*|[^|]*|(.+)$')
      if definition and (type(runs) ~= 'table' or runs.buffered
          or occurrence_live(type(runs.run) == 'string' and runs.run or nil)) then
        why = 'kept'  -- an occurrence runs (or waits buffered): its outcome is noted here
      elseif definition then
        local task = nil
        if head then task, why = task_state(head) end
        if not why then
          record = {cron = name, task_id = task and head or nil, task = task}
          for _, f in ipairs(CRON_FIELDS) do record[f[2]] = hget(f[1], name) end
          record.filled = redis.call('ZRANGEBYLEX', KEYS[21], '[' .. name .. '\0',
            '[' .. name .. '\0\255')
          if task then task_forget(head, task) end
          for _, f in ipairs(CRON_FIELDS) do
            local k_field = f[1]
            redis.call('HDEL', k_field, name)
          end
          if #record.filled > 0 then redis.call('ZREM', KEYS[21], unpack(record.filled)) end
        end
      end
    end
    if why == 'leased' then
      leased = leased + 1
    elseif why == 'kept' then
      kept = kept + 1
    elseif record then
      record.token = token_head .. i
      local packed = cjson.encode(record)
      redis.call('HSET', KEYS[13], field, packed)
      out[#out + 1] = field
      out[#out + 1] = packed
    end
  end
  table.insert(out, 1, kept)
  table.insert(out, 1, leased)
  return out
end

if op == 'put' then
  local put, existing, earliest = 0, 0, nil
  for i = 3, #ARGV, 2 do
    local field, record = ARGV[i], cjson.decode(ARGV[i + 1])
    if redis.call('HGET', KEYS[15], field) == record.token then
      record = {}  -- put here before (a killed mover's record, put again): nothing to write
    else
      redis.call('HSET', KEYS[15], field, record.token)
    end
    local id, task = field, record
    if record.cron then  -- a definition: written unless this shard has one of that name
      id, task = record.task_id, record.task
      if redis.call('HEXISTS', KEYS[16], record.cron) == 1 then
        existing, task = existing + 1, nil
      else
        for _, f in ipairs(CRON_FIELDS) do
          local k_field = f[1]
          if record[f[2]] then redis.call('HSET', k_field, record.cron, record[f[2]]) end
        end
        for _, member in ipairs(record.filled or {}) do redis.call('ZADD', KEYS[21], 0, member) end
        put = put + 1
      end
    end
    if task then
      local status, due = task_put(id, task)
      if status == 'put' then put = put + (record.cron and 0 or 1) end
      if status == 'existing' then existing = existing + 1 end
      if due and (not earliest or due < earliest) then earliest = due end
    end
  end
  if earliest then publish_wake(KEYS[14], ms(math.max(earliest, dueq_now(ARGV[1])))) end
  return {put, existing}
end

if op == 'drop' then
  local dropped = 0
  for i = 3, #ARGV do dropped = dropped + redis.call('HDEL', KEYS[13], ARGV[i]) end
  return dropped
end

return redis.error_reply('reshard.lua: unknown op ' .. tostring(op))
