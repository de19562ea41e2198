-- cancel.lua: remove a task in any state. A live lease on it is revoked and remembered as
-- "id|token" in KEYS[8] until an hour after its deadline, so its holder's ack, fail, extend or
-- release reports "cancelled" (TaskCancelled) rather than "lost". So is a lease that ran out
-- but was not reclaimed yet (kept an hour from the cancel).
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] dead     ZSET id -> died-at ms
-- KEYS[4] tasks    HASH id -> envelope
-- KEYS[5] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[6] errors   HASH id -> JSON list of error records
-- KEYS[7] stats    HASH counter -> int
-- KEYS[8] cancelled ZSET "id|token" -> lease deadline ms: leases revoked here
-- KEYS[9] key_state HASH per-key counts (see include/key_state.lua)
-- KEYS[10] parked  ZSET due tasks whose key was at a limit (see include/key_state.lua)
-- KEYS[11] key_wait ZSET key -> ms when its parked tasks may be claimable again
-- KEYS[12] wake    Pub/Sub channel: told when a key with parked tasks gets a free slot, or
--                  a lease ends while the queue is at its concurrency cap
-- KEYS[13] config   HASH setting -> value (keep_results_ms, concurrency, events_ms: see
--                  include/settings.lua)
-- KEYS[14] results  HASH id -> finished record (with keep_results_ms > 0: see
--                   include/results.lua)
-- KEYS[15] finished ZSET id -> finished ms (the records of results, for trimming)
-- KEYS[16] ended    Pub/Sub channel: the cancelled id (for q.wait)
-- KEYS[17] debounce HASH id -> debounce cap and follow-up (dropped with the task)
-- KEYS[18] events   STREAM outcome events (written only when events_ms > 0; see include/events.lua)
-- KEYS[19] batches  HASH batch id -> record (see include/batches.lua)
-- KEYS[20] batch_of HASH id -> batch id: the members of batches that have not ended
-- KEYS[21] batch_on HASH batch id -> completion task record, scheduled when its batch completes
-- KEYS[22] batch_ended ZSET batch id -> completed ms (for trimming)
-- KEYS[23] history  HASH "<minute>|<counter>" -> count (a batch's completion task scheduled)
-- KEYS[24] waiting  ZSET id -> due ms: tasks waiting for parents (include/dependencies.lua)
-- KEYS[25] after    HASH id -> "<parents not finished>|<policy>"
-- KEYS[26] children ZSET (scores 0) "<parent>\0<child>": one member per waiting edge
-- KEYS[27] steps    HASH the durable tasks' state (include/steps.lua): dropped
-- KEYS[28] fair_due ZSET tenant -> tasks in its lane (include/fair.lua): a laned task leaves it
-- KEYS[29] fair     ZSET tenant -> virtual time: a lane left empty leaves it
-- KEYS[30] claims  ZSET one record per claim (include/claims.lua: a first lease's meta value)
-- KEYS[31..39] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] id
-- Returns 1 if the task existed, else 0
-- @include batches
-- @include clock
-- @include dependencies
-- @include ended
-- @include events
-- @include key_limits
-- @include leases
-- @include levels
-- @include links
-- @include meta
-- @include results
-- @include settings
-- @include stats
-- @include steps
-- @include tasks
-- @include unpark
-- @include wake

local KEEP_MS = 3600000  -- a revoked lease is remembered this long after its deadline
local id = ARGV[2]
local envelope = redis.call('HGET', KEYS[4], id)
if not envelope then return 0 end
local priority, _, key = task_options(envelope)
local deadline = redis.call('ZSCORE', KEYS[2], id)
-- its attempt record (for a first lease, the one its claim's record gives)
local meta_value = meta_get(KEYS[5], KEYS[2], KEYS[30], id)
local now = dueq_now(ARGV[1])
history_use(KEYS[23], ARGV[1])
local settings = settings_read(KEYS[13], KEYS[7], 'keep_results_ms', 'concurrency', 'events_ms')
local keep_ms = settings.keep_results_ms or 0
if keep_ms > 0 then
  local attempt = meta_parse(meta_value)
  local record = results_record('cancelled', now, attempt, nil, nil,
    redis.call('HGET', KEYS[6], id) or nil)
  redis.call('HSET', KEYS[14], id, record .. '\n' .. envelope)
  redis.call('ZADD', KEYS[15], now, id)
end
results_trim(KEYS[14], KEYS[15], now, keep_ms, 1)
if not deadline then unpark_one(KEYS[10], KEYS[9], KEYS[5], key, priority, id, KEYS[28],
  KEYS[29])
end
if deadline then
  local counted_key = lease_key(KEYS[5], id)  -- the key it is counted in (per-key notes)
  if counted_key and key_unlease(KEYS[9], KEYS[11], counted_key, now) then
    publish_wake(KEYS[12], ms(now))
  end
  -- the concurrency cap: a consumer may be sleeping capped; tell it a lease ends
  if settings.concurrency and at_cap(KEYS[2], settings.concurrency, now) then
    publish_wake(KEYS[12], ms(now))
  end
  -- A lease that ran out but was not reclaimed yet still has no other holder: its holder
  -- is told "cancelled" too (remembered from now, as a live one is from its deadline).
  local _, token = meta_parse(meta_value)
  if token ~= '' then
    redis.call('ZADD', KEYS[8], math.max(tonumber(deadline), now), id .. '|' .. token)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. ms(now - KEEP_MS))
end
local k_level = level_key(due_levels(KEYS[1]), envelope)
redis.call('ZREM', k_level, id)
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], id)
if settings.events_ms then
  outcome_events.note('cancelled', id, (meta_parse(meta_value)), envelope)
end
forget(KEYS[4], KEYS[5], KEYS[6], id)
steps_forget(KEYS[27], {id})
redis.call('HDEL', KEYS[17], id)
stat_incr(KEYS[7], 'cancelled', 1)
publish_ended(KEYS[16], {id})
local bk = links.batch_keys(KEYS[19], KEYS[20], KEYS[21], KEYS[22], due_levels(KEYS[1]), KEYS[4],
  KEYS[7], KEYS[12])
local ak = links.after_keys(KEYS[24], KEYS[25], KEYS[26], KEYS[3], KEYS[6], KEYS[16], bk)
links.after_forget(ak, id)
links.tasks_ended(bk, ak, {id}, 'cancelled', now)
outcome_events.flush(KEYS[18], settings.events_ms, now, ARGV[1])
return 1
