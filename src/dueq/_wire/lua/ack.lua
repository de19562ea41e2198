-- ack.lua: finish leased tasks; each id must still be leased under the given token.
--
-- KEYS[1] leased   ZSET id -> lease deadline ms
-- KEYS[2] tasks    HASH id -> envelope
-- KEYS[3] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[4] errors   HASH id -> JSON list of error records
-- KEYS[5] stats    HASH counter -> int
-- KEYS[6] done     ZSET id -> acked-at ms (written only when the remember-done window > 0)
-- KEYS[7] config   HASH setting -> value (remember_done_ms, concurrency, keep_results_ms: see
--                  include/settings.lua)
-- KEYS[8] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- KEYS[9] key_state HASH per-key counts (see include/key_state.lua)
-- KEYS[10] key_wait ZSET key -> ms when its parked tasks may be claimable again
-- KEYS[11] wake    Pub/Sub channel: told when a key with parked tasks gets a free slot, or
--                  a lease ends while the queue is at its concurrency cap
-- KEYS[12] history  HASH "<minute>|<counter>" -> count: per-minute counts (see include/stats.lua)
-- KEYS[13] cron     HASH name -> definition JSON (asked only for "cron:..." ids)
-- KEYS[14] cron_last HASH name -> last outcome JSON (cron_note in include/cron_outcome.lua)
-- KEYS[15] results  HASH id -> finished record (written only when keep_results_ms > 0; see
--                   include/results.lua)
-- KEYS[16] finished ZSET id -> finished ms (the records of results, for trimming)
-- KEYS[17] ended    Pub/Sub channel: the acked ids, when results are kept (for q.wait)
-- KEYS[18] debounce HASH id -> debounce cap and follow-up (include/debounce.lua)
-- KEYS[19] due      ZSET id -> due ms (follow-ups of acked tasks, released children, a batch's
--                  completion task are scheduled there)
-- KEYS[20] events   STREAM outcome events (written only when events_ms > 0; see include/events.lua)
-- KEYS[21] batches  HASH batch id -> record (see include/batches.lua)
-- KEYS[22] batch_of HASH id -> batch id: the members of batches that have not ended
-- KEYS[23] batch_on HASH batch id -> completion task record, scheduled when its batch completes
-- KEYS[24] batch_ended ZSET batch id -> completed ms (for trimming)
-- KEYS[25] waiting  ZSET id -> due ms: tasks waiting for parents (include/dependencies.lua)
-- KEYS[26] after    HASH id -> "<parents not finished>|<policy>"
-- KEYS[27] children ZSET (scores 0) "<parent>\0<child>": one member per waiting edge
-- KEYS[28] dead     ZSET id -> died-at ms (children of a failed parent: not from here)
-- KEYS[29] steps    HASH the durable tasks' state (include/steps.lua): dropped for the acked
--                  ids (their step log kept in the result record while results are kept)
-- KEYS[30..38] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] remember-done window ms when the queue's config has none (deprecated constructor
--         keyword): record acked ids in done, and drop entries older than the window (at most
--         TRIM_DONE + acked per call); 0 leaves done alone
-- ARGV[3] the (id, lease token) pairs: each run of consecutive pairs under one token packed as
--         struct '>Hc0I4' (the token, the run's count), then '>Hc0' per id (one argument keeps
--         a batch cheap to send, and a claim's token is sent once; a repeated pair counts once)
-- ARGV[4] the handlers' values, one per pair as given, packed as struct '>Hc0' each: "" none,
--         "=" .. JSON the value to keep, "!" .. why the value could not be kept; or "" for
--         no values at all. Read only when keep_results_ms > 0 (the last of a repeated pair's
--         values counts)
-- Returns {acked, verdicts, kept_ms}: verdicts has one character per pair as given, 'h'
--         (held: acked), 'c' (its task was cancelled while leased: not acked) or 'l' (lease
--         lost, expired or taken over: not acked); kept_ms is keep_results_ms (0: none kept)
-- @include batches
-- @include bulk
-- @include chunked
-- @include clock
-- @include cron_outcome
-- @include dependencies
-- @include ended
-- @include events
-- @include followups
-- @include key_limits
-- @include lease_pairs
-- @include leases
-- @include levels
-- @include links
-- @include meta
-- @include results
-- @include settings
-- @include stats
-- @include steps
-- @include wake

local TRIM_DONE = 1000
local now = dueq_now(ARGV[1])
history_use(KEYS[12], ARGV[1])
-- done_window's rule (the queue's remember_done_ms, else ARGV[2]), in the same HMGET as the cap
-- and keep_results_ms
local settings = settings_read(KEYS[7], KEYS[5], 'remember_done_ms', 'concurrency',
  'keep_results_ms', 'events_ms')
local window = settings.remember_done_ms or tonumber(ARGV[2])
local keep_ms = settings.keep_results_ms or 0
local ids, tokens, positions = leases_unpack(ARGV[3])
if #ids == 0 then return {0, '', keep_ms} end
local done, verdicts, keys, with_meta = judge_leases(KEYS[1], KEYS[3], KEYS[8], ids, tokens,
  now)
local kept = {}  -- id -> the result kept (JSON), for the acked events
if #done > 0 and keep_ms > 0 then
  local values = {}  -- by distinct pair
  if ARGV[4] ~= '' then
    local pos, k = 1, 0
    while pos <= #ARGV[4] do
      local value
      value, pos = struct.unpack('>Hc0', ARGV[4], pos)
      k = k + 1
      values[positions[k]] = value
    end
  end
  local records, envelopes, metas = {}, redis.call('HMGET', KEYS[2], unpack(done)),
    redis.call('HMGET', KEYS[3], unpack(done))
  local errors = redis.call('HMGET', KEYS[4], unpack(done))
  local logs = redis.call('EXISTS', KEYS[29]) == 1 and redis.call('HMGET', KEYS[29], unpack(done))
    or {}
  local unstored = 0
  local d = 0
  for i = 1, #ids do
    if verdicts[i] == 'h' then
      d = d + 1
      local value, result, why = values[i] or '', nil, nil
      local mark = string.sub(value, 1, 1)
      if mark == '=' then result = string.sub(value, 2); kept[ids[i]] = result
      elseif mark == '!' then why = string.sub(value, 2); unstored = unstored + 1 end
      local attempt = metas[d] and meta_parse(metas[d]) or 1  -- (a first lease: none)
      records[#records + 1] = ids[i]
      records[#records + 1] = results_record('done', now, attempt, result, why, errors[d] or nil,
        logs[d] or nil)
        .. '\n' .. (envelopes[d] or '')
    end
  end
  call_chunked('HSET', KEYS[15], records)
  zadd_all(KEYS[16], now, done)
  if unstored > 0 then stat_incr(KEYS[5], 'results_unstored', unstored) end
end
if settings.events_ms then outcome_events.note_acked(KEYS[2], KEYS[3], done, kept) end
if #done > 0 then
  if #keys > 0 and keys_release(KEYS[9], KEYS[10], keys, now) then
    publish_wake(KEYS[11], ms(now))
  end
  -- the concurrency cap: a consumer may be sleeping capped; tell it leases end
  if settings.concurrency and at_cap(KEYS[1], settings.concurrency, now) then
    publish_wake(KEYS[11], ms(now))
  end
  call_chunked('ZREM', KEYS[1], done)
  call_chunked('HDEL', KEYS[2], done)
  -- (a first lease has no meta value: claim.lua wrote none)
  if #with_meta > 0 then call_chunked('HDEL', KEYS[3], with_meta) end
  -- error records: only tasks that failed or expired before have one (none: no HDEL)
  if redis.call('EXISTS', KEYS[4]) == 1 then call_chunked('HDEL', KEYS[4], done) end
  steps_forget(KEYS[29], done)
  stat_incr(KEYS[5], 'acked', #done)
  followups_start({debounce = KEYS[18], tasks = KEYS[2], meta = KEYS[3], errors = KEYS[4],
    stats = KEYS[5], wake = KEYS[11]}, due_levels(KEYS[19]), done, now)
  local bk = links.batch_keys(KEYS[21], KEYS[22], KEYS[23], KEYS[24], due_levels(KEYS[19]),
    KEYS[2], KEYS[5], KEYS[11])
  local ak = links.after_keys(KEYS[25], KEYS[26], KEYS[27], KEYS[28], KEYS[4], KEYS[17], bk)
  links.tasks_ended(bk, ak, done, 'acked', now)
  -- cron occurrences: their definition's last outcome (none without a definition: two calls
  -- per id saved when the queue has no cron schedules)
  if redis.call('EXISTS', KEYS[13]) == 1 then
    for i = 1, #done do
      local id = done[i]
      if string.byte(id, 1) == 99 then cron_note(KEYS[13], KEYS[14], id, 'acked', now) end
    end
  end
  if window > 0 then zadd_all(KEYS[6], now, done) end
end
if window > 0 then
  local expired = redis.call('ZCOUNT', KEYS[6], '-inf', '(' .. ms(now - window))
  if expired > 0 then
    redis.call('ZREMRANGEBYRANK', KEYS[6], 0, math.min(expired, TRIM_DONE + #done) - 1)
  end
end
results_trim(KEYS[15], KEYS[16], now, keep_ms, #done)
if keep_ms > 0 then publish_ended(KEYS[17], done) end
outcome_events.flush(KEYS[20], settings.events_ms, now, ARGV[1])
return {#done, verdict_string(verdicts, positions, #done), keep_ms}
