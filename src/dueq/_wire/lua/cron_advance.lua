-- cron_advance.lua: cron occurrences were claimed; for each that is its definition's pending
-- occurrence, move the schedule on (compare-and-set, so only one claimer advances a slot), and
-- apply the definition's policies to every occurrence that starts (overlap, limit, pause after
-- failures), atomically with the claim's outcome.
-- Every argument is checked before the first write; a state value that cannot be read (edited
-- by hand, or written by a faulty tool) is rebuilt for its own entry and never stops the others.
--
-- KEYS[1] cron        HASH name -> definition JSON (only asked whether the name still exists)
-- KEYS[2] cron_state  HASH name -> "head_ms|last_ms|head_id"
-- KEYS[3] due         ZSET id -> due ms
-- KEYS[4] tasks       HASH id -> envelope
-- KEYS[5] meta        HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[6] errors      HASH id -> JSON list of error records
-- KEYS[7] leased      ZSET id -> lease deadline ms
-- KEYS[8] stats       HASH counter -> int
-- KEYS[9] wake        Pub/Sub channel, told when the earliest due time moves earlier
-- KEYS[10] cron_paused HASH name -> paused-at ms (any value: paused; "<ms>|failures" when
--                     pause_after_failures paused it)
-- KEYS[11] history  HASH "<minute>|<counter>" -> count: per-minute counts (see include/stats.lua)
-- KEYS[12] cron_runs  HASH name -> runs record JSON (see include/cron_runs.lua)
-- KEYS[13] cron_last  HASH name -> last outcome JSON (cron_note in include/cron_outcome.lua)
-- KEYS[14] cancelled  ZSET "id|token" -> lease deadline ms: leases revoked (as cancel.lua)
-- KEYS[15] key_state  HASH per-key counts (see include/key_state.lua)
-- KEYS[16] key_wait   ZSET key -> ms when its parked tasks may be claimable again
-- KEYS[17] config     HASH setting -> value (keep_results_ms, concurrency, events_ms: read only
--                     when overlap cancel_other cancels a running occurrence)
-- KEYS[18] results    HASH id -> finished record (keep_results: include/results.lua)
-- KEYS[19] finished   ZSET id -> finished ms (the records of results, for trimming)
-- KEYS[20] ended      Pub/Sub channel: the ids of occurrences cancelled here (for q.wait)
-- KEYS[21] events     STREAM outcome events (written only when events_ms > 0)
-- KEYS[22] batches    HASH batch id -> record (see include/batches.lua)
-- KEYS[23] batch_of   HASH id -> batch id: the members of batches that have not ended
-- KEYS[24] batch_on   HASH batch id -> completion task record
-- KEYS[25] batch_ended ZSET batch id -> completed ms (for trimming)
-- KEYS[26] waiting    ZSET id -> due ms: tasks waiting for parents (dependency notes)
-- KEYS[27] after      HASH id -> "<parents not finished>|<policy>"
-- KEYS[28] children   ZSET (scores 0) "<parent>\0<child>": one member per waiting edge
-- KEYS[29] dead       ZSET id -> died-at ms (children of a cancelled occurrence end dead)
-- KEYS[30] claims     ZSET one record per claim (include/claims.lua: a first lease's meta value)
-- KEYS[31..39] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2..] one entry per claimed occurrence, each:
--         name, slot ms (advance only if it is the pending one), occurrence id, lease token,
--         "1" to drop the occurrence (a missed slot that must not run) or "0" to run it,
--         envelope for the occurrences it adds (a version-3 head's expiry is ms after the
--         slot: missed occurrences store it from their slots, the next pending one without
--         it, and a claimed pending one gets it now; see cron_expiring in
--         include/cron_expiry.lua), next
--         pending slot ms (after now; "" when the
--         definition's window has no more), next pending id, policies, count of missed
--         occurrences to run now, then that many pairs: due ms, id. Policies is "" for a
--         definition without any (its next occurrence is due at its slot), else
--         "<next pending due ms (slot + jitter)>|<overlap>|<limit>|<pause after failures>",
--         overlap "allow_all", "skip", "buffer_one" or "cancel_other", limit and pause after
--         failures "" for none
-- Returns {earliest due ms of the occurrences added or -1, then one status per entry}:
--          1 the schedule advanced;
--          0 the slot was not the pending one (only the last fired slot is updated, nothing is
--            dropped), or the definition is gone (nothing changes);
--          2 the state was missing or unreadable: it was rebuilt with the next pending slot
--            (after now, so no slot fires twice), the occurrence runs, no missed slot is added;
--         -1 the entry's numbers are out of range: nothing changed for it;
--          3 the definition is paused: the occurrence runs (also a missed slot), nothing is
--            scheduled, and the state keeps its pending slot (an unreadable one is rebuilt as
--            for 2, without adding the occurrence); resuming schedules from then on;
--          4 overlap skip/buffer_one: the previous occurrence still runs, this one was
--            dropped (counted in the runs record's "skipped"); a pending one still advanced;
--            (overlap cancel_other: the running one ends "cancelled" as cancel.lua ends a task,
--            with its results record, ended message, event, batch count and children, and
--            this one runs: 1 or 0 as usual)
--          5 overlap buffer_one: it waits in due until the previous occurrence ends;
--          6 the definition is finished (limit reached, or its window ended): dropped;
--          7 pause after failures: the definition was paused now, the occurrence dropped;
--          8 the occurrence is past its expiry (slot + the definition's expires=): it does not
--            run and goes back to due with its expiry, so the next claim ends it "expired"
--            (claim.lua); the schedule moved on as for 1 (or stayed, as for 0, 2 and 3).
--         An error (before any write) if the entries are not laid out as above.
-- @include batches
-- @include clock
-- @include cron_expiry
-- @include cron_outcome
-- @include cron_runs
-- @include cron_state
-- @include dependencies
-- @include ended
-- @include events
-- @include expiry
-- @include key_limits
-- @include leases
-- @include levels
-- @include links
-- @include meta
-- @include results
-- @include settings
-- @include stats
-- @include tasks
-- @include wake

-- Pass 1: lay out and check every entry, writing nothing.
local FIXED = 10
local entries = {}
local i = 2
while i <= #ARGV do
  if i + FIXED - 1 > #ARGV then return redis.error_reply('ERR cron_advance: truncated entry') end
  local missed = tonumber(ARGV[i + FIXED - 1])
  if not missed or missed < 0 or missed % 1 ~= 0 or i + FIXED - 1 + 2 * missed > #ARGV then
    return redis.error_reply('ERR cron_advance: bad missed count')
  end
  local e = {
    name = ARGV[i], slot = ARGV[i + 1], id = ARGV[i + 2], token = ARGV[i + 3],
    drop = ARGV[i + 4] == '1', envelope = ARGV[i + 5], next_ms = ARGV[i + 6],
    next_due = ARGV[i + 6], next_id = ARGV[i + 7], overlap = 'allow_all',
    first_missed = i + FIXED, last_missed = i + FIXED - 1 + 2 * missed,
  }
  e.ok = ms_text_ok(e.slot, false) and ms_text_ok(e.next_ms, true)
  if ARGV[i + 8] ~= '' then
    local due, overlap, limit, pause_after =
      string.match(ARGV[i + 8], '^(%d*)|([%a_]+)|(%d*)|(%d*)$')
    e.ok = e.ok and due ~= nil and ms_text_ok(due, e.next_ms == '')
    e.next_due, e.overlap = due, overlap
    e.limit, e.pause_after = tonumber(limit), tonumber(pause_after)
  end
  for j = e.first_missed, e.last_missed, 2 do
    e.ok = e.ok and ms_text_ok(ARGV[j], false)
  end
  entries[#entries + 1] = e
  i = e.last_missed + 1
end

-- Pass 2: carry the entries out; nothing below raises on what it reads.
local now = dueq_now(ARGV[1])
history_use(KEYS[11], ARGV[1])
local levels = due_levels(KEYS[3])
local previous_head = levels_head(levels)
local earliest = nil
local out = {}

local function add(id, envelope, due_text)
  local due = tonumber(due_text)
  if add_task(KEYS[4], level_key(levels, envelope), KEYS[8], id, envelope, due) then
    if earliest == nil or due < earliest then earliest = due end
  end
end

-- End this claim's lease of an occurrence (its key's lease too); false if it is not held.
local function unlease(e)
  if not lease_held(KEYS[7], KEYS[5], e.id, e.token, now) then return false end
  redis.call('ZREM', KEYS[7], e.id)
  local key = lease_key(KEYS[5], e.id)  -- the key it is counted in (the per-key notes)
  if key and key_unlease(KEYS[15], KEYS[16], key, now) then publish_wake(KEYS[9], ms(now)) end
  return true
end

local function drop(e)
  if unlease(e) then
    forget(KEYS[4], KEYS[5], KEYS[6], e.id)
    stat_incr(KEYS[8], 'cron_skipped', 1)
  end
end

-- Where an occurrence still is: 'leased', 'due' (waiting for a retry) or nil (it ended).
local function live(id)
  if not id then return nil end
  if redis.call('ZSCORE', KEYS[7], id) then return 'leased' end
  local envelope = redis.call('HGET', KEYS[4], id)
  local k_level = envelope and level_key(levels, envelope)
  if k_level and redis.call('ZSCORE', k_level, id) then return 'due' end
  return nil
end

-- A claimed occurrence past its expiry: back to due, now, with its expiry (already stored), so
-- that the next claim ends it "expired" as it ends any task past its expiry.
local function expire_later(e)
  if not unlease(e) then return end
  redis.call('HDEL', KEYS[5], e.id)
  local k_level = level_key(levels, redis.call('HGET', KEYS[4], e.id))
  redis.call('ZADD', k_level, now, e.id)
  if earliest == nil or now < earliest then earliest = now end
end

-- The settings cancel_running needs, read by its first call (nil until then: a call with no
-- running occurrence to cancel reads no settings and writes no events).
local cancel_settings = nil

-- Cancel a running occurrence as cancel.lua does: its holder is told "cancelled", a
-- "cancelled" results record is kept (keep_results), its id is published on the ended channel
-- (q.wait), a "cancelled" event is noted (events), and it is counted in its batch and ends its
-- waiting children (links.tasks_ended).
local function cancel_running(id, where)
  local envelope = redis.call('HGET', KEYS[4], id)
  local meta_value = meta_get(KEYS[5], KEYS[7], KEYS[30], id)  -- (a first lease's: made)
  local attempt = meta_parse(meta_value)
  cancel_settings = cancel_settings or settings_read(KEYS[17], KEYS[8], 'keep_results_ms',
    'concurrency', 'events_ms')
  local keep_ms = cancel_settings.keep_results_ms or 0
  if keep_ms > 0 and envelope then
    local record = results_record('cancelled', now, attempt, nil, nil,
      redis.call('HGET', KEYS[6], id) or nil)
    redis.call('HSET', KEYS[18], id, record .. '\n' .. envelope)
    redis.call('ZADD', KEYS[19], now, id)
  end
  results_trim(KEYS[18], KEYS[19], now, keep_ms, 1)
  if where == 'leased' then
    local deadline = tonumber(redis.call('ZSCORE', KEYS[7], id))
    local key = lease_key(KEYS[5], id)  -- the key it is counted in (the per-key notes)
    if key and key_unlease(KEYS[15], KEYS[16], key, now) then publish_wake(KEYS[9], ms(now)) end
    local cap = cancel_settings.concurrency
    if cap and at_cap(KEYS[7], cap, now) then publish_wake(KEYS[9], ms(now)) end
    local _, token = meta_parse(meta_value)
    if token ~= '' then redis.call('ZADD', KEYS[14], math.max(deadline, now), id .. '|' .. token) end
    redis.call('ZREMRANGEBYSCORE', KEYS[14], '-inf', '(' .. ms(now - 3600000))
    redis.call('ZREM', KEYS[7], id)
  else
    local k_level = level_key(levels, envelope)
    redis.call('ZREM', k_level, id)
  end
  if cancel_settings.events_ms then outcome_events.note('cancelled', id, attempt, envelope) end
  forget(KEYS[4], KEYS[5], KEYS[6], id)
  stat_incr(KEYS[8], 'cancelled', 1)
  cron_note(KEYS[1], KEYS[13], id, 'cancelled', now, nil)
  publish_ended(KEYS[20], {id})
  local bk = links.batch_keys(KEYS[22], KEYS[23], KEYS[24], KEYS[25], levels, KEYS[4], KEYS[8],
    KEYS[9])
  local ak = links.after_keys(KEYS[26], KEYS[27], KEYS[28], KEYS[29], KEYS[6], KEYS[20], bk)
  links.tasks_ended(bk, ak, {id}, 'cancelled', now)
end

-- The policies for an occurrence that starts now (first delivery): returns a status if it must
-- not run (4, 5, 6, 7), else nil (it runs, and is counted in fired: a definition without
-- policies passes every check and is counted too).
local function police(e, runs)
  if runs.finished then
    drop(e)
    return 6
  end
  if e.pause_after and cron_failures(KEYS[13], e.name) >= e.pause_after then
    redis.call('HSET', KEYS[10], e.name, ms(now) .. '|failures')
    drop(e)
    return 7
  end
  local running = runs.run ~= e.id and runs.run or nil
  local where = e.overlap ~= 'allow_all' and live(running) or nil
  if where and e.overlap == 'cancel_other' then
    cancel_running(running, where)
  elseif where then
    local waiting = runs.buffered
    if e.overlap == 'buffer_one' and (not waiting or waiting == e.id
        or redis.call('HEXISTS', KEYS[4], waiting) == 0) and unlease(e) then
      -- wait in due until the running one's lease deadline (or its retry), then look again
      local k_running = where == 'leased' and KEYS[7]
        or level_key(levels, redis.call('HGET', KEYS[4], running))
      local at = redis.call('ZSCORE', k_running, running)
      redis.call('HDEL', KEYS[5], e.id)
      local k_level = level_key(levels, redis.call('HGET', KEYS[4], e.id))
      redis.call('ZADD', k_level, math.max(tonumber(at) or now, now), e.id)
      runs.buffered = e.id
      return 5
    end
    drop(e)
    runs.skipped = runs.skipped + 1
    return 4
  end
  runs.fired = runs.fired + 1
  runs.run = e.id
  if runs.buffered == e.id then runs.buffered = nil end
  if e.limit and runs.fired >= e.limit then runs.finished = 'limit' end
  return nil
end

for _, e in ipairs(entries) do
  local head, last, head_id = cron_state_read(redis.call('HGET', KEYS[2], e.name), e.name)
  local function fired(ms_text)
    if last == '' or tonumber(ms_text) > tonumber(last) then last = ms_text end
  end
  local paused = e.ok and redis.call('HEXISTS', KEYS[10], e.name) == 1
  local runs, stopped = nil, nil
  if e.ok and string.byte(e.envelope, 1) == 51 then  -- the definition has expires=
    local stored = redis.call('HGET', KEYS[4], e.id)
    if stored and stored == cron_pending(e.envelope) then  -- its pending form: add the expiry
      stored = cron_expiring(e.envelope, e.id, tonumber(e.slot))
      redis.call('HSET', KEYS[4], e.id, stored)
      e.expired = task_expired(stored, now)
    end
  end
  -- Every definition counts its started occurrences (fired), with policies or without.
  if e.ok and not e.drop and not e.expired
      and redis.call('HEXISTS', KEYS[1], e.name) == 1 then
    runs = cron_runs_read(KEYS[12], e.name)
    local attempt = meta_parse(redis.call('HGET', KEYS[5], e.id))
    if attempt <= 1 and runs.run ~= e.id then stopped = police(e, runs) end
  end
  local pending = head and tonumber(head) == tonumber(e.slot)
  if not e.ok then
    out[#out + 1] = -1
  elseif stopped and (stopped >= 6 or not pending or paused) then
    out[#out + 1] = stopped
  elseif not head then
    if redis.call('HEXISTS', KEYS[1], e.name) == 0 then
      out[#out + 1] = 0
    else
      if not paused and e.next_ms ~= '' then
        add(e.next_id, cron_pending(e.envelope), e.next_due)
      end
      redis.call('HSET', KEYS[2], e.name, (e.next_ms ~= '' and e.next_ms or e.slot) .. '|' ..
        e.slot .. '|' .. (e.next_ms ~= '' and e.next_id or e.id))
      stat_incr(KEYS[8], 'cron_state_rebuilt', 1)
      out[#out + 1] = stopped or (paused and 3 or 2)
    end
  elseif paused or not pending or (runs and runs.finished and not stopped) then
    -- Not the pending slot (a redelivery), paused, or its last firing: it runs, the schedule
    -- stays.
    if not stopped and not e.expired then fired(e.slot) end
    redis.call('HSET', KEYS[2], e.name, head .. '|' .. last .. '|' .. head_id)
    out[#out + 1] = paused and 3 or 0
  else
    if stopped or e.expired then
      -- skipped or buffered by overlap, or past its expiry: the schedule still moves on
    elseif not e.drop then
      fired(e.slot)
    else
      drop(e)
    end
    for j = e.first_missed, e.last_missed, 2 do
      add(ARGV[j + 1], cron_expiring(e.envelope, ARGV[j + 1]), ARGV[j])
    end
    if e.next_ms ~= '' then
      add(e.next_id, cron_pending(e.envelope), e.next_due)
      redis.call('HSET', KEYS[2], e.name, e.next_ms .. '|' .. last .. '|' .. e.next_id)
    else
      if not runs then runs = cron_runs_read(KEYS[12], e.name) end
      runs.finished = runs.finished or 'end'
      redis.call('HSET', KEYS[2], e.name, head .. '|' .. last .. '|' .. head_id)
    end
    out[#out + 1] = stopped or 1
  end
  if runs then cron_runs_write(KEYS[12], e.name, runs) end
  if e.expired then
    expire_later(e)
    out[#out] = 8
  end
end
if earliest then wake_if_earlier(KEYS[9], previous_head, earliest) end
if cancel_settings then outcome_events.flush(KEYS[21], cancel_settings.events_ms, now, ARGV[1]) end
table.insert(out, 1, earliest or -1)
return out
