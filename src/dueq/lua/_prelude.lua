-- _prelude.lua: helpers prepended to every dueq script by scripts.py (not a script itself).
-- ARGV[1] of every script is the queue clock: epoch ms, or "" for the server's TIME.
-- meta values are "attempt|token|due_ms|first_ms": deliveries so far, the live lease token (""
-- when not leased), the due time the current delivery was claimed at, and when the task was
-- first claimed (the start of its retry history, as tenacity counts it).

-- The queue clock in epoch ms, and the microseconds past that ms (0 for an injected clock).
local function dueq_now_us(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg), 0 end
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(us / 1000), us % 1000
end

local function dueq_now(arg)
  local now = dueq_now_us(arg)
  return now
end

local function ms(n) return string.format('%d', n) end

local function meta_parse(v)
  if not v then return 0, '', '', '' end
  local a, t, d, f = string.match(v, '^(%d+)|([^|]*)|(%d*)|(%d*)$')
  return tonumber(a) or 0, t or '', d or '', f or ''
end

-- Keep attempt and first-claim time, drop the lease: the task is no longer leased.
local function meta_unlease(k_meta, id, attempt_delta)
  local a, _, _, f = meta_parse(redis.call('HGET', k_meta, id))
  a = math.max(a + attempt_delta, 0)
  redis.call('HSET', k_meta, id, a .. '|||' .. f)
  return a
end

-- A lease is held when the token matches and its deadline is still in the future.
local function lease_held(k_leased, k_meta, id, token, now)
  local deadline = redis.call('ZSCORE', k_leased, id)
  if not deadline or tonumber(deadline) <= now then return false end
  local _, t = meta_parse(redis.call('HGET', k_meta, id))
  return t ~= '' and t == token
end

-- Append one error record (a JSON object) to the task's JSON list of errors.
local function error_append(k_errors, id, record)
  local old = redis.call('HGET', k_errors, id)
  if old then
    redis.call('HSET', k_errors, id, string.sub(old, 1, -2) .. ',' .. record .. ']')
  else
    redis.call('HSET', k_errors, id, '[' .. record .. ']')
  end
end

-- '{"type":...}' -> '{"at":<now>,"type":...}'
local function stamp(record, now)
  return '{"at":' .. ms(now) .. ',' .. string.sub(record, 2)
end

local function forget(k_tasks, k_meta, k_errors, id)
  redis.call('HDEL', k_tasks, id)
  redis.call('HDEL', k_meta, id)
  redis.call('HDEL', k_errors, id)
end

local function head_score(k_zset)
  local head = redis.call('ZRANGE', k_zset, 0, 0, 'WITHSCORES')
  if head[2] then return tonumber(head[2]) end
  return nil
end

-- Publish on the wake channel when due_ms is earlier than the head that was there before.
local function wake_if_earlier(k_wake, previous_head, due_ms)
  if previous_head == nil or due_ms < previous_head then
    redis.call('PUBLISH', k_wake, ms(due_ms))
  end
end

-- Drop dead tasks older than max_age_ms and beyond max_count (bounded work per call).
local TRIM_BATCH = 1000
local function trim_dead(k_dead, k_tasks, k_meta, k_errors, now, max_count, max_age_ms)
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
    redis.call('ZREMRANGEBYRANK', k_dead, 0, excess - 1)
    trimmed = trimmed + #oldest
  end
  return trimmed
end

-- Call a variadic command in chunks (Lua's unpack has a stack limit).
local function call_chunked(cmd, key, args)
  local step = 4000
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end

-- ZADD every id with the same score.
local function zadd_all(k_zset, score, ids)
  local args = {}
  for _, id in ipairs(ids) do
    args[#args + 1] = score
    args[#args + 1] = id
  end
  call_chunked('ZADD', k_zset, args)
end

-- Add one task due at due_ms unless the id exists in any state; true if it was added.
local function add_task(k_tasks, k_due, k_stats, id, envelope, due_ms)
  if redis.call('HSETNX', k_tasks, id, envelope) == 0 then return false end
  redis.call('ZADD', k_due, due_ms, id)
  redis.call('HINCRBY', k_stats, 'scheduled', 1)
  return true
end

-- cron_state values are "head_ms|last_ms|head_id": the pending occurrence and the last fired
-- slot of one cron definition.
local function cron_state_parse(v)
  if not v then return nil end
  local head, last, id = string.match(v, '^(%d*)|(%d*)|(.*)$')
  return head, last, id
end

-- Withdraw a cron definition's pending occurrence if it is still waiting in due (one already
-- leased or retrying runs out); it counts as cancelled.
local function cron_withdraw(k_due, k_tasks, k_meta, k_errors, k_stats, id)
  if id and id ~= '' and redis.call('ZREM', k_due, id) == 1 then
    forget(k_tasks, k_meta, k_errors, id)
    redis.call('HINCRBY', k_stats, 'cancelled', 1)
  end
end
