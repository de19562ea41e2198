-- reschedule.lua: move a scheduled (not leased, not dead) task to a new due time.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] wake     Pub/Sub channel
-- KEYS[3] tasks    HASH id -> envelope (read for the task's priority)
-- KEYS[4] meta     HASH id -> "attempt|token|due_ms|first_ms" (a parked task's due ms)
-- KEYS[5] key_state HASH per-key counts (see include/key_state.lua)
-- KEYS[6] parked  ZSET due tasks whose key was at a limit (see include/key_state.lua)
-- KEYS[7] fair_due ZSET tenant -> tasks in its lane (include/fair.lua): a laned task leaves it
-- KEYS[8] fair     ZSET tenant -> virtual time: a lane left empty leaves it
-- KEYS[9..17] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] id
-- ARGV[3] flags: 1 when ARGV[4] is an absolute epoch ms, 0 when it is a delay from now
-- ARGV[4] due (ms); an absolute due time before now is stored as now (lag counts from the
--         reschedule, and the task queues behind tasks already due)
-- Returns the new due ms, or -1 when the task is not scheduled
-- @include clock
-- @include levels
-- @include unpark
-- @include wake

local now = dueq_now(ARGV[1])
local id = ARGV[2]
local envelope = redis.call('HGET', KEYS[3], id)
local k_level = level_key(due_levels(KEYS[1]), envelope)
local zadd_flag = 'XX'
if not redis.call('ZSCORE', k_level, id) then
  -- a parked task (its key was at a limit) is scheduled too: it leaves the parked set
  local priority, _, key = task_options(envelope)
  if not unpark_one(KEYS[6], KEYS[5], KEYS[4], key, priority, id, KEYS[7], KEYS[8]) then
    return -1
  end
  zadd_flag = 'NX'
end
local due = tonumber(ARGV[4])
if ARGV[3] ~= '1' then due = now + due elseif due < now then due = now end
local previous_head = head_score(k_level)
redis.call('ZADD', k_level, zadd_flag, due, id)
wake_if_earlier(KEYS[2], previous_head, due)
return due
