-- fail.lua: record failed deliveries, then put each task back in due after a delay, or bury it.
-- Each failure is settled as if alone, in the order given (a repeated (id, token) finds its
-- lease gone the second time); their outcome events are written, and the retried and dead
-- counters counted, once at the end.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] tasks    HASH id -> envelope
-- KEYS[4] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[5] errors   HASH id -> JSON list of error records
-- KEYS[6] dead     ZSET id -> died-at ms
-- KEYS[7] stats    HASH counter -> int
-- KEYS[8] wake     Pub/Sub channel (also told when a lease ends at the concurrency cap)
-- KEYS[9] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- KEYS[10] key_state HASH per-key counts (see include/key_state.lua)
-- KEYS[11] key_wait ZSET key -> ms when its parked tasks may be claimable again
-- KEYS[12] history  HASH "<minute>|<counter>" -> count: per-minute counts (see include/stats.lua)
-- KEYS[13] cron     HASH name -> definition JSON (asked only for "cron:..." ids)
-- KEYS[14] cron_last HASH name -> last outcome JSON (cron_note in include/cron_outcome.lua)
-- KEYS[15] config   HASH setting -> value (concurrency: see include/settings.lua)
-- KEYS[16] ended    Pub/Sub channel: the id, when the task dies or expires (for q.wait)
-- KEYS[17] results  HASH id -> finished record (an expired task, with keep_results_ms > 0)
-- KEYS[18] finished ZSET id -> finished ms (the records of results, for trimming)
-- KEYS[19] debounce HASH id -> debounce cap and follow-up (include/debounce.lua)
-- KEYS[20] events   STREAM outcome events (written only when events_ms > 0; see include/events.lua)
-- KEYS[21] batches  HASH batch id -> record (see include/batches.lua)
-- KEYS[22] batch_of HASH id -> batch id: the members of batches that have not ended
-- KEYS[23] batch_on HASH batch id -> completion task record, scheduled when its batch completes
-- KEYS[24] batch_ended ZSET batch id -> completed ms (for trimming)
-- KEYS[25] waiting  ZSET id -> due ms: tasks waiting for parents (include/dependencies.lua)
-- KEYS[26] after    HASH id -> "<parents not finished>|<policy>"
-- KEYS[27] children ZSET (scores 0) "<parent>\0<child>": one member per waiting edge
-- KEYS[28] steps    HASH the durable tasks' state (include/steps.lua): kept by a dead task, dropped
--                  when it expires or the dead set's cap trims it
-- KEYS[29] claims  ZSET one record per claim (include/claims.lua: a first lease's meta value)
-- KEYS[30..38] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] dead-letter cap: most entries kept
-- ARGV[3] dead-letter cap: oldest age kept, ms
-- ARGV[4..] the failures, five arguments each (ARGV[4 + 5(i-1)] onwards for the i-th):
--         id, lease token, error record (a JSON object without "at", which this script
--         adds), "retry" or "dead", retry delay ms (with "retry")
-- Returns {status, at ms} per failure as given, flat ({status1, at1, status2, at2, ...}):
--         1 = back in due at that time, 2 = dead since then, 0 = lease lost, 3 = the task was
--         cancelled while leased (nothing recorded), 4 = expired since then (its next attempt
--         would come at or after its expiry: include/expiry.lua)
-- @include batches
-- @include clock
-- @include cron_outcome
-- @include dead_letter
-- @include dependencies
-- @include ended
-- @include errors
-- @include events
-- @include expire
-- @include expiry
-- @include followups
-- @include key_limits
-- @include leases
-- @include levels
-- @include links
-- @include meta
-- @include settings
-- @include stats
-- @include wake

local now = dueq_now(ARGV[1])
history_use(KEYS[12], ARGV[1])
local settings = settings_read(KEYS[15], KEYS[7], 'concurrency', 'keep_results_ms', 'events_ms')
local dead_count, dead_age_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local levels = due_levels(KEYS[1])
local bk = links.batch_keys(KEYS[21], KEYS[22], KEYS[23], KEYS[24], levels, KEYS[3], KEYS[7],
  KEYS[8])
local ak = links.after_keys(KEYS[25], KEYS[26], KEYS[27], KEYS[6], KEYS[5], KEYS[16], bk)
local retried, buried = 0, 0  -- counted once, at the end (nothing here reads the counters)

-- One failure: {status, at ms} as the header says. `action` is "retry" or "dead".
local function fail_one(id, token, record, action, delay_ms)
  local verdict = lease_verdict(KEYS[2], KEYS[4], KEYS[9], id, token, now)
  if verdict == 'c' then return 3, now end
  if verdict == 'l' then return 0, now end
  local envelope = redis.call('HGET', KEYS[3], id)
  -- the key this lease is counted in (its meta names it: include/key_state.lua), also
  -- when its data is gone
  local key = lease_key(KEYS[4], id)
  if not envelope then  -- its data is gone (evicted, deleted by hand)
    redis.log(redis.LOG_WARNING, '[dueq] failed lease of ' .. id .. ' had no stored task ' ..
      '(evicted or deleted by hand)' .. (key and '; its key ' .. key .. ' released' or ''))
  end
  if key and key_unlease(KEYS[10], KEYS[11], key, now) then
    publish_wake(KEYS[8], ms(now))
  end
  -- the concurrency cap: a consumer may be sleeping capped; tell it a lease ends
  local cap = settings.concurrency
  if cap and at_cap(KEYS[2], cap, now) then publish_wake(KEYS[8], ms(now)) end
  meta_unlease(KEYS[4], KEYS[2], KEYS[29], id, 0)
  error_append(KEYS[5], id, stamp(record, now))
  -- a retry that would start at or after the task's expiry ends it expired instead
  local dead = action == 'dead'
  local due = not dead and now + tonumber(delay_ms)
  local expires = due and task_expired(envelope, due)
  outcome_events.note(dead and 'dead' or (expires and 'expired' or 'retried'), id,
    settings.events_ms and meta_parse(redis.call('HGET', KEYS[4], id)), envelope, nil,
    settings.events_ms and stamp(record, now))
  redis.call('ZREM', KEYS[2], id)
  if string.byte(id, 1) == 99 then  -- a cron occurrence: its definition's last outcome
    local decoded = errors_decode(record)
    cron_note(KEYS[13], KEYS[14], id, dead and 'dead' or 'retrying', now,
      type(decoded) == 'table' and decoded.type or nil)
  end
  if dead then
    redis.call('ZADD', KEYS[6], now, id)
    buried = buried + 1
    trim_dead(KEYS[6], KEYS[3], KEYS[4], KEYS[5], now, dead_count, dead_age_ms, KEYS[28])
    publish_ended(KEYS[16], {id})
    followups_start({debounce = KEYS[19], tasks = KEYS[3], meta = KEYS[4], errors = KEYS[5],
      stats = KEYS[7], wake = KEYS[8], dead = KEYS[6], steps = KEYS[28]}, levels, {id}, now)
    links.tasks_ended(bk, ak, {id}, 'dead', now)  -- (children buried here note their events)
    return 2, now
  end
  if expires then
    tasks_expire({tasks = KEYS[3], meta = KEYS[4], errors = KEYS[5], stats = KEYS[7],
      results = KEYS[17], finished = KEYS[18], ended = KEYS[16], debounce = KEYS[19],
      wake = KEYS[8], steps = KEYS[28]}, levels, {id}, now, settings.keep_results_ms or 0)
    links.tasks_ended(bk, ak, {id}, 'expired', now)
    return 4, now
  end
  local k_level = level_key(levels, envelope)
  local previous_head = head_score(k_level)
  redis.call('ZADD', k_level, due, id)
  retried = retried + 1
  wake_if_earlier(KEYS[8], previous_head, due)
  return 1, due
end

local replies = {}
for i = 4, #ARGV - 4, 5 do
  local status, at = fail_one(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
  replies[#replies + 1] = status
  replies[#replies + 1] = at
end
if retried > 0 then stat_incr(KEYS[7], 'retried', retried) end
if buried > 0 then stat_incr(KEYS[7], 'dead', buried) end
-- every outcome noted above, in order (each failure's own, then its buried children's)
outcome_events.flush(KEYS[20], settings.events_ms, now, ARGV[1])
return replies
