-- reschedule.lua: move a scheduled (not leased, not dead) task to a new due time.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] wake     Pub/Sub channel
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] id
-- ARGV[3] due: "+<delay ms>" relative to now, or "<epoch ms>"
-- Returns the new due ms, or -1 when the task is not scheduled

local now = dueq_now(ARGV[1])
local id = ARGV[2]
if not redis.call('ZSCORE', KEYS[1], id) then return -1 end
local due
if string.sub(ARGV[3], 1, 1) == '+' then
  due = now + tonumber(string.sub(ARGV[3], 2))
else
  due = tonumber(ARGV[3])
end
local previous_head = head_score(KEYS[1])
redis.call('ZADD', KEYS[1], 'XX', due, id)
wake_if_earlier(KEYS[2], previous_head, due)
return due
