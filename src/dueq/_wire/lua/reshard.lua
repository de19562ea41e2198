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
-- not written again, so a killed mover never brings a finished task back. A task that is leased, keyed (a limit or fair key), in a
-- batch, or waiting for parents is not taken: it stays until it settles (or, keyed, is left).
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
-- KEYS[16] due      ZSET id -> due ms (priority 0)
-- KEYS[17..25] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] "take", "put" or "drop"
-- take: ARGV[3..] ids. Returns {leased, kept, id1, record1, id2, record2, ...}: how many were
--       not taken because leased, and because keyed, batched or waiting; then each taken
--       task's id and record (an id with nothing here is left out)
-- put:  ARGV[3..] pairs id, record. Returns {put, existing}: tasks written, and tasks whose
--       id this shard had already (their record's task left out; its result or done mark kept
--       when this shard has none); a record put here before (its token in `arrived`) is left
--       out and counted in neither
-- drop: ARGV[3..] ids. Returns the number of records deleted from `moving`
-- @include clock
-- @include levels
-- @include wake

local op = ARGV[2]
local levels = due_levels(KEYS[16])
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

if op == 'take' then
  local leased, kept, out = 0, 0, {}
  local t = redis.call('TIME')  -- the server's: a token differs from every earlier take's
  local token_head = KEYS[13] .. '|' .. t[1] .. '.' .. t[2] .. '|'
  for i = 3, #ARGV do
    local id = ARGV[i]
    local record, movable = {}, true
    local envelope = hget(KEYS[1], id)
    if envelope then
      local p, _, key, fair_key = task_options(envelope)
      if redis.call('ZSCORE', KEYS[4], id) then
        leased, movable = leased + 1, false
      elseif key or fair_key or redis.call('HEXISTS', KEYS[11], id) == 1
          or redis.call('HEXISTS', KEYS[12], id) == 1 then
        kept, movable = kept + 1, false
      else
        record.due = zscore(levels[p], id)
        record.dead = zscore(KEYS[5], id)
        if not record.due and not record.dead then  -- parked or in a lane: it waits for its key
          kept, movable = kept + 1, false
        else
          record.envelope, record.level = envelope, p
          record.meta, record.errors = hget(KEYS[2], id), hget(KEYS[3], id)
          record.debounce = hget(KEYS[10], id)
          for _, f in ipairs(STEP_FIELDS) do record[f[2]] = hget(KEYS[9], id .. f[1]) end
        end
      end
    end
    if movable then
      record.result, record.finished = hget(KEYS[6], id), zscore(KEYS[7], id)
      record.done = zscore(KEYS[8], id)
      if next(record) ~= nil then
        record.token = token_head .. i
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
        local packed = cjson.encode(record)
        redis.call('HSET', KEYS[13], id, packed)
        out[#out + 1] = id
        out[#out + 1] = packed
      end
    end
  end
  table.insert(out, 1, kept)
  table.insert(out, 1, leased)
  return out
end

if op == 'put' then
  local put, existing, earliest = 0, 0, nil
  for i = 3, #ARGV, 2 do
    local id, record = ARGV[i], cjson.decode(ARGV[i + 1])
    if redis.call('HGET', KEYS[15], id) == record.token then
      record = {}  -- put here before (a killed mover's record, put again): nothing to write
    else
      redis.call('HSET', KEYS[15], id, record.token)
    end
    if record.envelope then
      if redis.call('HSETNX', KEYS[1], id, record.envelope) == 1 then
        put = put + 1
        if record.due then
          local k_level = levels[tonumber(record.level)]
          redis.call('ZADD', k_level, record.due, id)
          local due = tonumber(record.due)
          if not earliest or due < earliest then earliest = due end
        end
        if record.dead then redis.call('ZADD', KEYS[5], record.dead, id) end
        if record.meta then redis.call('HSET', KEYS[2], id, record.meta) end
        if record.errors then redis.call('HSET', KEYS[3], id, record.errors) end
        if record.debounce then redis.call('HSET', KEYS[10], id, record.debounce) end
        for _, f in ipairs(STEP_FIELDS) do
          if record[f[2]] then redis.call('HSET', KEYS[9], id .. f[1], record[f[2]]) end
        end
      else
        existing = existing + 1
      end
    end
    if record.result and redis.call('HSETNX', KEYS[6], id, record.result) == 1 then
      redis.call('ZADD', KEYS[7], record.finished or dueq_now(ARGV[1]), id)
    end
    if record.done and not redis.call('ZSCORE', KEYS[8], id) then
      redis.call('ZADD', KEYS[8], record.done, id)
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
