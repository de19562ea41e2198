-- extend.lua: move a held lease's deadline to now + the given length.
--
-- KEYS[1] leased   ZSET id -> lease deadline ms
-- KEYS[2] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] id
-- ARGV[3] lease token
-- ARGV[4] new lease length ms, counted from now
-- Returns the new deadline ms, or -1 when the lease is lost

local now = dueq_now(ARGV[1])
if not lease_held(KEYS[1], KEYS[2], ARGV[2], ARGV[3], now) then return -1 end
local deadline = now + tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[2])
return deadline
