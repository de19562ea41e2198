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
-- KEYS[10] history  HASH "<minute>|<counter>" -> count: per-minute counts (see include/stats.lua)
-- KEYS[11] cron_runs  HASH name -> runs record JSON (a new or replaced definition starts anew)
-- KEYS[12..20] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME (the minute its occurrence counts in the history)
-- ARGV[2] name
-- ARGV[3] definition JSON (canonical, so equal definitions are equal strings)
-- ARGV[4] "1" to replace a different definition of the same name, "0" to refuse it
-- ARGV[5] next occurrence: slot ms, or "" when its window has no slot after now (then it is
--         stored finished, with nothing scheduled)
-- ARGV[6] next occurrence: task id
-- ARGV[7] next occurrence: envelope (a version-3 head's expiry is ms after the slot: the
--         pending occurrence is stored without it, see cron_pending in include/cron_expiry.lua)
-- ARGV[8] next occurrence: due ms (the slot plus its jitter)
-- Returns 0 unchanged (same definition, its pending occurrence exists, it is paused or it is
--         finished), 1
--         added, 2 replaced, 3 unchanged but its missing pending occurrence was scheduled
--         again, -1 refused (a different definition exists and ARGV[4] is "0")
-- A state value that cannot be read counts as none (no pending occurrence is trusted, so a
-- corrupted one never withdraws a task it merely names); adding the definition rewrites it.
-- A paused definition stays paused: nothing is scheduled (a replaced one keeps its old state
-- until cron_control resumes it). A new definition clears a paused mark left without one.
-- @include cron_expiry
-- @include cron_runs
-- @include cron_state
-- @include levels
-- @include stats
-- @include tasks
-- @include wake

history_use(KEYS[10], ARGV[1])
local levels = due_levels(KEYS[4])
local name, definition = ARGV[2], ARGV[3]
local current = redis.call('HGET', KEYS[1], name)
local _, last, head_id = cron_state_read(redis.call('HGET', KEYS[2], name), name)
local paused = redis.call('HEXISTS', KEYS[3], name) == 1
local result
if current == definition then
  if paused then return 0 end
  if head_id and head_id ~= '' and redis.call('HEXISTS', KEYS[5], head_id) == 1 then return 0 end
  if cron_runs_read(KEYS[11], name).finished then return 0 end
  result = 3
elseif current then
  if ARGV[4] ~= '1' then return -1 end
  -- The old schedule's pending occurrence goes; one already leased or retrying runs out.
  cron_withdraw(levels, KEYS[5], KEYS[6], KEYS[7], KEYS[8], head_id)
  redis.call('HDEL', KEYS[11], name)
  result = 2
else
  if paused then redis.call('HDEL', KEYS[3], name) end
  redis.call('HDEL', KEYS[11], name)
  paused = false
  result = 1
end
redis.call('HSET', KEYS[1], name, definition)
if paused then return result end
if ARGV[5] == '' then
  cron_runs_write(KEYS[11], name, {fired = 0, skipped = 0, finished = 'end'})
  return result
end
local due_ms = tonumber(ARGV[8])
local previous_head = levels_head(levels)
local envelope = cron_pending(ARGV[7])
if add_task(KEYS[5], level_key(levels, envelope), KEYS[8], ARGV[6], envelope, due_ms) then
  wake_if_earlier(KEYS[9], previous_head, due_ms)
end
redis.call('HSET', KEYS[2], name, ARGV[5] .. '|' .. (last or '') .. '|' .. ARGV[6])
return result
