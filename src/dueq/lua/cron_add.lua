-- cron_add.lua: store a cron definition and schedule its next occurrence, all or nothing.
--
-- KEYS[1] cron        HASH name -> definition JSON
-- KEYS[2] cron_state  HASH name -> "head_ms|last_ms|head_id"
-- KEYS[3] cron_paused HASH name -> paused-at ms (any value: paused)
-- KEYS[4] due         ZSET id -> due ms
-- KEYS[5] tasks       HASH id -> envelope
-- KEYS[6] meta        HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[7] errors      HASH id -> JSON list of error records
-- KEYS[8] stats       HASH counter -> int (a replaced pending occurrence counts as cancelled)
-- KEYS[9] wake        Pub/Sub channel, told when the earliest due time moves earlier
-- KEYS[10] history  HASH "<minute>|<counter>" -> count: per-minute counts (see the prelude)
-- ARGV[1] now ms, or "" for server TIME (the minute its occurrence counts in the history)
-- ARGV[2] name
-- ARGV[3] definition JSON (canonical, so equal definitions are equal strings)
-- ARGV[4] "1" to replace a different definition of the same name, "0" to refuse it
-- ARGV[5] next occurrence: due ms
-- ARGV[6] next occurrence: task id
-- ARGV[7] next occurrence: envelope
-- Returns 0 unchanged (same definition, its pending occurrence exists, or it is paused), 1
--         added, 2 replaced, 3 unchanged but its missing pending occurrence was scheduled
--         again, -1 refused (a different definition exists and ARGV[4] is "0")
-- A state value that cannot be read counts as none (no pending occurrence is trusted, so a
-- corrupted one never withdraws a task it merely names); adding the definition rewrites it.
-- A paused definition stays paused: nothing is scheduled (a replaced one keeps its old state
-- until cron_control resumes it). A new definition clears a paused mark left without one.

history_use(KEYS[10], ARGV[1])
local name, definition = ARGV[2], ARGV[3]
local current = redis.call('HGET', KEYS[1], name)
local _, last, head_id = cron_state_read(redis.call('HGET', KEYS[2], name), name)
local paused = redis.call('HEXISTS', KEYS[3], name) == 1
local result
if current == definition then
  if paused then return 0 end
  if head_id and head_id ~= '' and redis.call('HEXISTS', KEYS[5], head_id) == 1 then return 0 end
  result = 3
elseif current then
  if ARGV[4] ~= '1' then return -1 end
  -- The old schedule's pending occurrence goes; one already leased or retrying runs out.
  cron_withdraw(KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], head_id)
  result = 2
else
  if paused then redis.call('HDEL', KEYS[3], name) end
  paused = false
  result = 1
end
redis.call('HSET', KEYS[1], name, definition)
if paused then return result end
local due_ms = tonumber(ARGV[5])
local previous_head = head_score(KEYS[4])
if add_task(KEYS[5], KEYS[4], KEYS[8], ARGV[6], ARGV[7], due_ms) then
  wake_if_earlier(KEYS[9], previous_head, due_ms)
end
redis.call('HSET', KEYS[2], name, ARGV[5] .. '|' .. (last or '') .. '|' .. ARGV[6])
return result
