-- reschedule.lua: move a scheduled (not leased, not dead) task to a new due time.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] wake     Pub/Sub channel
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] id
-- ARGV[3] flags: 1 when ARGV[4] is an absolute epoch ms, 0 when it is a delay from now
-- ARGV[4] due (ms)
-- Returns the new due ms, or -1 when the task is not scheduled

local now = dueq_now(ARGV[1])
local id = ARGV[2]
if not redis.call('ZSCORE', KEYS[1], id) then return -1 end
local due = tonumber(ARGV[4])
if ARGV[3] ~= '1' then due = now + due end
local previous_head = head_score(KEYS[1])
redis.call('ZADD', KEYS[1], 'XX', due, id)
wake_if_earlier(KEYS[2], previous_head, due)
return due
