-- reschedule.lua: move a scheduled (not leased, not dead) task to a new due time.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] wake     Pub/Sub channel
-- KEYS[3] tasks    HASH id -> envelope (read for the task's priority)
-- KEYS[4..12] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] id
-- ARGV[3] flags: 1 when ARGV[4] is an absolute epoch ms, 0 when it is a delay from now
-- ARGV[4] due (ms)
-- Returns the new due ms, or -1 when the task is not scheduled

local now = dueq_now(ARGV[1])
local id = ARGV[2]
local k_level = level_key(due_levels(KEYS[1]), redis.call('HGET', KEYS[3], id))
if not redis.call('ZSCORE', k_level, id) then return -1 end
local due = tonumber(ARGV[4])
if ARGV[3] ~= '1' then due = now + due end
local previous_head = head_score(k_level)
redis.call('ZADD', k_level, 'XX', due, id)
wake_if_earlier(KEYS[2], previous_head, due)
return due
