-- step.lua: read a durable task's step log, commit a step, or record a failed run of one,
-- each under the task's lease, in one call (issue 39). A run reads its log here, not with a
-- plain HGET, so that a holder whose lease was taken over (and whose task may have ended
-- meanwhile, its log gone) learns it before it runs any step's body again. The task stays leased; park.lua is the call that hands it back (a
-- sleep, a wait, a step's own retry). Kept small: each of a task's steps costs one call of it.
--
-- KEYS[1] leased   ZSET id -> lease deadline ms
-- KEYS[2] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[3] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- KEYS[4] steps    HASH the durable tasks' state (include/steps.lua, include/step_log.lua)
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] task id
-- ARGV[3] lease token
-- ARGV[4] op: "read" (the log), "commit" (a step's result) or "fail" (a failed run of a
--         step); ARGV[5..7] are not read by "read"
-- ARGV[5] the position of the record: how many steps the caller found committed
-- ARGV[6] the record's head: its JSON object without the closing brace
-- ARGV[7] commit: the result (JSON); fail: the error (JSON)
-- Returns {status, value}: status 1 done (value: the log for "read", else ""), 0 lease lost,
--   3 cancelled while leased, 5 the log does not have ARGV[5] committed steps (value: how
--   many it has). A commit sent again whose line is the log's last already is done (1).
-- @include clock
-- @include leases
-- @include step_log

local now = dueq_now(ARGV[1])
local id = ARGV[2]
local verdict = lease_verdict(KEYS[1], KEYS[2], KEYS[3], id, ARGV[3], now)
if verdict == 'c' then return {3, ''} end
if verdict ~= 'h' then return {0, ''} end
local log = redis.call('HGET', KEYS[4], id)
if ARGV[4] == 'read' then return {1, log or ''} end
local committed, _, kept = step_log_scan(log)
local line = ARGV[4] == 'commit' and 'D' .. ARGV[6] .. ',"r":' .. ARGV[7] .. '}'
  or 'F' .. ARGV[6] .. ',"e":' .. ARGV[7] .. '}'
if committed ~= tonumber(ARGV[5]) then
  -- this very commit again (its reply was lost with a dropped connection and the client sent
  -- it once more): it is the log's last line already, so it is done, not a second writer
  if ARGV[4] == 'commit' and committed == tonumber(ARGV[5]) + 1 and
    step_log_ends_with(kept, line) then
    return {1, ''}
  end
  return {5, committed}
end
redis.call('HSET', KEYS[4], id, step_log_add(kept, line))
return {1, ''}
