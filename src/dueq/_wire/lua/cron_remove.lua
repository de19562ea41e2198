-- cron_remove.lua: delete a cron definition and its pending occurrence (one already leased or
-- retrying runs out; dead occurrences stay in the dead-letter queue).
--
-- KEYS[1] cron        HASH name -> definition JSON
-- KEYS[2] cron_state  HASH name -> "head_ms|last_ms|head_id"
-- KEYS[3] cron_paused HASH name -> paused-at ms (its paused mark goes too)
-- KEYS[4] due         ZSET id -> due ms
-- KEYS[5] tasks       HASH id -> envelope
-- KEYS[6] meta        HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[7] errors      HASH id -> JSON list of error records
-- KEYS[8] stats       HASH counter -> int (a removed pending occurrence counts as cancelled)
-- KEYS[9] cron_last   HASH name -> last outcome JSON (its record goes too)
-- KEYS[10] cron_runs  HASH name -> runs record JSON (its record goes too)
-- KEYS[11] cron_filled ZSET (scores 0) "<name>\0<slot ms>": slots backfilled (its go too)
-- KEYS[12..20] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" (unused; kept for the common ARGV layout)
-- ARGV[2] name
-- Returns 1 if the definition existed, else 0
-- A state value that cannot be read names no pending occurrence: nothing else is withdrawn.
-- @include cron_state
-- @include levels

local name = ARGV[2]
local _, _, head_id = cron_state_read(redis.call('HGET', KEYS[2], name), name)
if redis.call('HDEL', KEYS[1], name) == 0 then return 0 end
redis.call('HDEL', KEYS[2], name)
redis.call('HDEL', KEYS[3], name)
redis.call('HDEL', KEYS[9], name)
redis.call('HDEL', KEYS[10], name)
redis.call('ZREMRANGEBYLEX', KEYS[11], '[' .. name .. '\0', '(' .. name .. '\1')
cron_withdraw(due_levels(KEYS[4]), KEYS[5], KEYS[6], KEYS[7], KEYS[8], head_id)
return 1
