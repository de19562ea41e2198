-- cancel.lua: remove a task in any state; a live lease on it is revoked (its ack gets LeaseLost).
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] dead     ZSET id -> died-at ms
-- KEYS[4] tasks    HASH id -> envelope
-- KEYS[5] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[6] errors   HASH id -> JSON list of error records
-- KEYS[7] stats    HASH counter -> int
-- ARGV[1] now ms, or "" (unused; kept for the common ARGV layout)
-- ARGV[2] id
-- Returns 1 if the task existed, else 0

local id = ARGV[2]
if redis.call('HEXISTS', KEYS[4], id) == 0 then return 0 end
redis.call('ZREM', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], id)
forget(KEYS[4], KEYS[5], KEYS[6], id)
stat_incr(KEYS[7], 'cancelled', 1)
return 1
