-- cron_control.lua: pause, resume or run now one cron definition, all or nothing.
--
-- KEYS[1] cron        HASH name -> definition JSON
-- KEYS[2] cron_state  HASH name -> "head_ms|last_ms|head_id"
-- KEYS[3] cron_paused HASH name -> paused-at ms (any value: paused)
-- KEYS[4] due         ZSET id -> due ms
-- KEYS[5] tasks       HASH id -> envelope
-- KEYS[6] meta        HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[7] errors      HASH id -> JSON list of error records
-- KEYS[8] stats       HASH counter -> int (a withdrawn pending occurrence counts as cancelled)
-- KEYS[9] wake        Pub/Sub channel, told when the earliest due time moves earlier
-- KEYS[10] history  HASH "<minute>|<counter>" -> count: per-minute counts (see include/stats.lua)
-- KEYS[11] cron_runs  HASH name -> runs record JSON (resume past the window's end: finished)
-- KEYS[12] cron_last  HASH name -> last outcome JSON (resume clears its failure count)
-- KEYS[13..21] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] action: "pause", "resume" or "run_now"
-- ARGV[3] name
-- ARGV[4] resume, run_now: the definition JSON the caller planned from (compare-and-set)
-- ARGV[5] resume: the next slot ms (after now; "" when the window has none); run_now: unused
-- ARGV[6] resume: the next occurrence's id; run_now: the extra occurrence's id
-- ARGV[7] resume, run_now: the envelope of the occurrence it adds (a version-3 head's expiry
--         is ms after the slot: resume's pending occurrence is stored without it, run_now's
--         counts it from now; see cron_expiring in include/cron_expiry.lua)
-- ARGV[8] resume: the next occurrence's due ms (slot plus jitter)
-- ARGV[9] resume: the definition's pause_after_failures ("" none): a definition whose count of
--         consecutive dead occurrences reached it counts as paused, and resume clears the count
-- Returns  1 done: paused (its pending occurrence withdrawn if still waiting in due), resumed
--            (the next occurrence scheduled), or the extra occurrence is due now;
--          0 nothing to do: already paused, not paused, or a task with that id exists;
--         -1 no definition of that name;
--         -2 the definition is no longer ARGV[4] (changed since the caller read it): nothing
--            changed, read it again.
--         An error (before any write) for an unknown action or a bad slot.
-- Pause marks the definition in cron_paused and withdraws its pending occurrence; cron_add
-- and cron_advance then schedule nothing for it. Resume clears the mark and writes the state
-- "next|last|next_id" with its occurrence, so concurrent resumes add exactly one: the mark is
-- tested and cleared in the same script.
-- @include clock
-- @include cron_expiry
-- @include cron_outcome
-- @include cron_runs
-- @include cron_state
-- @include levels
-- @include stats
-- @include tasks
-- @include wake

history_use(KEYS[10], ARGV[1])
local action, name = ARGV[2], ARGV[3]
if action ~= 'pause' and action ~= 'resume' and action ~= 'run_now' then
  return redis.error_reply('ERR cron_control: unknown action')
end
if action == 'resume' and not ms_text_ok(ARGV[5], true) then
  return redis.error_reply('ERR cron_control: bad slot')
end
local current = redis.call('HGET', KEYS[1], name)
if not current then return -1 end
local paused = redis.call('HEXISTS', KEYS[3], name) == 1
local levels = due_levels(KEYS[4])

if action == 'pause' then
  if paused then return 0 end
  local _, _, head_id = cron_state_read(redis.call('HGET', KEYS[2], name), name)
  redis.call('HSET', KEYS[3], name, ms(dueq_now(ARGV[1])))
  cron_withdraw(levels, KEYS[5], KEYS[6], KEYS[7], KEYS[8], head_id)
  return 1
end

if current ~= ARGV[4] then return -2 end
local previous_head = levels_head(levels)
local due
if action == 'resume' then
  local pause_after = tonumber(ARGV[9])
  local failed = pause_after and cron_failures(KEYS[12], name) >= pause_after
  if failed then  -- the count starts again
    local v = redis.call('HGET', KEYS[12], name)
    redis.call('HSET', KEYS[12], name, (string.gsub(v, ',"failures":%d+', '')))
  end
  if not paused then return failed and 1 or 0 end
  local _, last = cron_state_read(redis.call('HGET', KEYS[2], name), name)
  redis.call('HDEL', KEYS[3], name)
  if ARGV[5] == '' then
    local runs = cron_runs_read(KEYS[11], name)
    runs.finished = runs.finished or 'end'
    cron_runs_write(KEYS[11], name, runs)
    return 1
  end
  due = tonumber(ARGV[8])
  redis.call('HSET', KEYS[2], name, ARGV[5] .. '|' .. (last or '') .. '|' .. ARGV[6])
  local envelope = cron_pending(ARGV[7])
  if not add_task(KEYS[5], level_key(levels, envelope), KEYS[8], ARGV[6], envelope, due) then
    return 1
  end
else
  due = dueq_now(ARGV[1])
  local envelope = cron_expiring(ARGV[7], ARGV[6], due)
  if not add_task(KEYS[5], level_key(levels, envelope), KEYS[8], ARGV[6], envelope, due) then
    return 0
  end
end
wake_if_earlier(KEYS[9], previous_head, due)
return 1
