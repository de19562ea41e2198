-- signal.lua: send a signal to a durable task (issue 39): kept in order until the task's
-- wait_for takes it (step.lua); a task handed back to wait for this name is made due now.
--
-- KEYS[1] steps    HASH the durable tasks' state (include/steps.lua, include/step_log.lua)
-- KEYS[2] tasks    HASH id -> envelope (a task is live while it has one and is not dead)
-- KEYS[3] dead     ZSET id -> died-at ms
-- KEYS[4] wake     Pub/Sub channel (the woken task is due now)
-- KEYS[5] due      ZSET id -> due ms (level 0; the levels are the last nine KEYS)
-- KEYS[6..14] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] task id
-- ARGV[3] signal name (letters, digits and _ . : - only: dueq._util.checks)
-- ARGV[4] payload (JSON)
-- ARGV[5] the most signals a task may hold not yet taken
-- Returns {status, pending}: status 1 kept, 2 kept and the waiting task woken, 0 no live
--   task of that id (nothing written), 4 the task holds ARGV[5] signals already (nothing
--   written); pending: its signals not yet taken, this one included
-- @include clock
-- @include levels
-- @include step_log
-- @include wake

local now = dueq_now(ARGV[1])
local id, name = ARGV[2], ARGV[3]
local envelope = redis.call('HGET', KEYS[2], id)
if not envelope or redis.call('ZSCORE', KEYS[3], id) then return {0, 0} end
local k_signals = id .. '\0s'
local signals = redis.call('HGET', KEYS[1], k_signals)
local pending = 1
if signals then
  local _, newlines = string.gsub(signals, '\n', '\n')
  pending = newlines + 2
end
if pending > tonumber(ARGV[5]) then return {4, pending - 1} end
local line = name .. '\t' .. ms(now) .. '\t' .. ARGV[4]
redis.call('HSET', KEYS[1], k_signals, signals and (signals .. '\n' .. line) or line)
-- a task handed back to wait for this name (its log's open line) is due now
local _, open = step_log_scan(redis.call('HGET', KEYS[1], id))
if not open or string.sub(open, 1, 1) ~= 'W' or
  not string.find(open, '{"n":"' .. name .. '"', 1, true) then
  return {1, pending}
end
local k_level = level_key(due_levels(KEYS[5]), envelope)
local due = redis.call('ZSCORE', k_level, id)
if not due or tonumber(due) <= now then return {1, pending} end
local previous_head = head_score(k_level)
redis.call('ZADD', k_level, 'XX', now, id)
wake_if_earlier(KEYS[4], previous_head, now)
return {2, pending}
