-- claim.lua: return expired leases to due (or dead), then lease due tasks to one consumer.
-- Cost: O(log N + expired + limit).
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] tasks    HASH id -> envelope
-- KEYS[4] meta     HASH id -> "attempt|token|due_ms|first_ms" (none is written for a task leased
--                  here for its first attempt without a counted key: include/claims.lua)
-- KEYS[5] errors   HASH id -> JSON list of error records
-- KEYS[6] dead     ZSET id -> died-at ms
-- KEYS[7] stats    HASH counter -> int
-- KEYS[8] config   HASH setting -> value (paused, rate, key_rate, key_concurrency,
--                  concurrency, key_limit:<key>, events_ms; values setting_parse refuses
--                  count as unset, and are logged once: include/settings.lua)
-- KEYS[9] rate     ZSET "<n>*<token>" -> claimed-at ms: the claims of the last rate window,
--                  one entry per claim that leased n tasks (an entry without "<n>*" counts 1);
--                  their sum is kept in the stats field rate_in_window
-- KEYS[10] key_state HASH key -> "leased|next rate slot ms|parked" (see include/key_state.lua)
-- KEYS[11] parked  ZSET (scores 0) "<key>\0<9 - priority><due ms, 15 digits><id>": due tasks
--                  whose key was at a limit
-- KEYS[12] key_wait ZSET key -> ms when its parked tasks may be claimable again
-- KEYS[13] history  HASH "<minute>|<counter>" -> count: per-minute counts (see include/stats.lua)
-- KEYS[14] cron     HASH name -> definition JSON (asked only for "cron:..." ids)
-- KEYS[15] cron_last HASH name -> last outcome JSON (cron_note in include/cron_outcome.lua)
-- KEYS[16] ended    Pub/Sub channel: the ids of tasks sent to dead or expired here (for q.wait)
-- KEYS[17] results  HASH id -> finished record (expired tasks, with keep_results_ms > 0)
-- KEYS[18] finished ZSET id -> finished ms (the records of results, for trimming)
-- KEYS[19] debounce HASH id -> debounce cap and follow-up (include/debounce.lua)
-- KEYS[20] events   STREAM outcome events: expired leases retried or dead, tasks buried or
--                  expired here (written only when events_ms > 0; see include/events.lua)
-- KEYS[21] batches  HASH batch id -> record (see include/batches.lua)
-- KEYS[22] batch_of HASH id -> batch id: the members of batches that have not ended
-- KEYS[23] batch_on HASH batch id -> completion task record, scheduled when its batch completes
-- KEYS[24] batch_ended ZSET batch id -> completed ms (for trimming)
-- KEYS[25] wake     Pub/Sub channel: told when a batch's completion task is scheduled here
-- KEYS[26] waiting  ZSET id -> due ms: tasks waiting for parents (include/dependencies.lua)
-- KEYS[27] after    HASH id -> "<parents not finished>|<policy>"
-- KEYS[28] children ZSET (scores 0) "<parent>\0<child>": one member per waiting edge
-- KEYS[29] steps    HASH the durable tasks' state (include/steps.lua): dropped for tasks that expire
--                  here or that the dead set's cap trims
-- KEYS[30] fair     ZSET tenant -> virtual time: the lanes of a fair queue (include/fair.lua)
-- KEYS[31] fair_due ZSET tenant -> tasks in its lane (include/fair.lua)
-- KEYS[32] fair_claims0 ZSET tenant -> tasks claimed from its lane in an even minute
-- KEYS[33] fair_claims1 ZSET the same, in an odd minute
-- KEYS[34] claims  ZSET one record per claim that leases: its deadline, unique among the
--                  queue's claims, fences the first leases it writes no meta value for
--                  (include/claims.lua)
-- KEYS[35..43] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] limit: most due tasks to lease (0 only reclaims)
-- ARGV[3] lease length ms
-- ARGV[4] max_attempts: an expired lease on this attempt sends the task to dead (a task's own
--         max_attempts, kept in its envelope, wins)
-- ARGV[5] most expired leases handled in this call
-- ARGV[6] dead-letter cap: most entries kept
-- ARGV[7] dead-letter cap: oldest age kept, ms
-- ARGV[8] holder: who takes the leases (a worker id, without "|"), kept in the lease token as
--         "<deadline ms>@<holder>" and in the claim's record, so that listings show who holds
--         what; "" for none
-- ARGV[9..] backoff ms after attempt 1, 2, ... for expired leases (the last entry repeats)
-- Returns {now, next_due ms or -1, next_lease_deadline ms or -1, token, lease_deadline (the
--          claim's own, unique: it may be a few ms after now + the lease length),
--          now_us (microseconds past now, so a consumer can sleep to the due time exactly),
--          dropped (due ids without stored data, removed), buried (due tasks sent to dead here:
--          unreadable meta, or as many attempts as max_attempts already made),
--          flags (bit 1, paused: the queue is paused: nothing is leased and next_due is -1, so
--          consumers sleep until resume wakes them; expired leases are still reclaimed;
--          bit 2, fair: the queue's fairness is on, so consumers hold fewer deliveries),
--          column (one entry per leased task, in order, joined by "|": "<due ms>" for a first
--          delivery first claimed now, else "<due ms>,<attempt>,<first_claimed ms>"),
--          id1, envelope1, id2, envelope2, ...}
-- (Two elements per task, not five: every element of a reply is converted from Lua and
-- written as RESP one by one, and the attempt and first-claim of most tasks are the defaults.)
-- Due tasks are leased by priority (9 first), then earliest due within a priority. A due task
-- past its expiry is not leased: it ends "expired" (include/expiry.lua).
-- With a rate "n/per_ms" set, at most n tasks are leased in any window of per_ms (counted by
-- the claims kept in KEYS[9], one entry per claim with its count: O(1) work per claim, not
-- per task); when the rate holds tasks back, next_due is when the oldest claim of the window
-- leaves it, so consumers sleep exactly until then.
-- With fairness "key" set, due tasks are moved into their tenants' lanes and leased from the
-- lanes in weighted fair order (include/fair.lua); with fairness "off", lanes left from when it
-- was on are moved back to the levels, a budget per claim.
-- With a concurrency cap set, the queue never holds more than that many live leases (leased
-- entries whose deadline is after now); a claim that leaves the queue at its cap returns
-- next_due -1, so consumers sleep until a lease ends (ack, fail and release publish on the wake
-- channel when they end one at the cap) or the next lease deadline (an expiry frees a slot).
-- @include batches
-- @include bulk
-- @include chunked
-- @include claims
-- @include clock
-- @include counters
-- @include cron_outcome
-- @include dead_letter
-- @include dependencies
-- @include ended
-- @include epoch_ms
-- @include errors
-- @include events
-- @include expire
-- @include expiry
-- @include fair
-- @include followups
-- @include key_limits
-- @include key_state
-- @include levels
-- @include links
-- @include meta
-- @include parked
-- @include rate
-- @include run_scores
-- @include settings
-- @include stats
-- @include wake

local now, now_us = dueq_now_us(ARGV[1])
history_use(KEYS[13], ARGV[1])
local limit = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local max_attempts = tonumber(ARGV[4])
local backoff = {}
local holder = ARGV[8]
for i = 9, #ARGV do backoff[#backoff + 1] = tonumber(ARGV[i]) end
local levels = due_levels(KEYS[1])

-- Send a task to dead with one error record (it is not leased when this is called).
local died = 0
local buried = {}  -- the ids sent to dead, published on the ended channel
local function bury(id, attempt, kind, message)
  redis.call('HSET', KEYS[4], id, attempt .. '|||')
  local record = cjson.encode({at = now, attempt = attempt, type = kind, message = message})
  error_append(KEYS[5], id, record)
  outcome_events.note('dead', id, attempt, redis.call('HGET', KEYS[3], id) or nil, nil, record)
  redis.call('ZADD', KEYS[6], now, id)
  died = died + 1
  buried[died] = id
  if string.byte(id, 1) == 99 then cron_note(KEYS[14], KEYS[15], id, 'dead', now, kind) end
end

-- 1. Expired leases: the holder died or hung. That delivery counts as a failed attempt: dead
-- on the last attempt, else retried after the backoff, or ended expired when that retry would
-- start at or after the task's expiry (as fail.lua judges a failure).
-- Their keys' leases end together (one keys_release after the loop): the key a lease's meta
-- names ("|<key>": a counted lease, include/key_state.lua), even when its task data is
-- gone (evicted, deleted by hand), so the key's other tasks are not held back by a lease
-- nobody can end.
-- The tasks that end expired in this claim, never leased (tasks_expire after the lease loop):
-- expired leases whose retry would start at or after their expiry (here), and due tasks past
-- their expiry (the lease loop).
local too_late = {}
do
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0,
    tonumber(ARGV[5]))
  local expired_keys = {}
  for _, id in ipairs(expired) do
    local meta_value = redis.call('HGET', KEYS[4], id)
    if not meta_value then  -- a first lease (none was written): its claim's record gives it
      meta_value = claims.meta(KEYS[34], redis.call('ZSCORE', KEYS[2], id), lease_ms)
    end
    redis.call('ZREM', KEYS[2], id)
    local envelope = redis.call('HGET', KEYS[3], id)
    if envelope then
      local priority, own_attempts = task_options(envelope)
      local attempt, token, _, first, readable, key = meta_parse(meta_value)
      if key then expired_keys[#expired_keys + 1] = key end
      if not readable then
        bury(id, 0, 'CorruptTask', 'its attempt record was unreadable when its lease expired')
      else
        redis.call('HSET', KEYS[4], id, attempt .. '|||' .. first)
        -- the record names the holder whose lease ran out (the token's "@<holder>", if any)
        local gone = string.match(token, '@(.+)$')
        local record = '{"at":' .. ms(now) .. ',"attempt":' .. attempt ..
          ',"type":"LeaseExpired","message":"lease expired before ack or fail: ' ..
          'the worker died, hung or outlived its lease","traceback":null' ..
          (gone and ',"worker":' .. cjson.encode(gone) or '') .. '}'
        error_append(KEYS[5], id, record)
        local final = attempt >= (own_attempts or max_attempts)
        -- as fail.lua judges a failure: a retry that would start at or after the task's
        -- expiry ends it expired instead (tasks_expire below, with the claim's own expiries)
        local retry_at = not final and
          now + (backoff[math.min(math.max(attempt, 1), #backoff)] or 0)
        local ends = final and 'dead' or
          (task_expired(envelope, retry_at) and 'expired' or 'retried')
        outcome_events.note(ends, id, attempt, envelope, nil, record)
        if string.byte(id, 1) == 99 and ends ~= 'expired' then  -- a cron occurrence: its
          -- definition's last outcome (an expiry is not one, as at claim time)
          cron_note(KEYS[14], KEYS[15], id, final and 'dead' or 'retrying', now, 'LeaseExpired')
        end
        if final then
          redis.call('ZADD', KEYS[6], now, id)
          died = died + 1
          buried[died] = id
        elseif ends == 'expired' then
          too_late[#too_late + 1] = id
        else
          redis.call('ZADD', levels[priority], retry_at, id)
        end
      end
    else
      local _, _, _, _, _, key = meta_parse(meta_value)
      if key then expired_keys[#expired_keys + 1] = key end
      redis.log(redis.LOG_WARNING, '[dueq] expired lease of ' .. id .. ' in ' .. KEYS[2] ..
        ' had no stored task (evicted or deleted by hand): dropped' ..
        (key and ', its key ' .. key .. ' released' or ''))
      redis.call('HDEL', KEYS[4], id)
      redis.call('HDEL', KEYS[5], id)
    end
  end
  if #expired_keys > 0 then keys_release(KEYS[10], KEYS[12], expired_keys, now) end
  if #expired > 0 then stat_incr(KEYS[7], 'expired', #expired) end
end

-- 2. Lease up to `limit` due tasks: highest priority first, earliest due within a priority;
-- a task whose key is at one of its limits is parked instead (see include/key_state.lua).
local config = settings_read(KEYS[8], KEYS[7], 'paused', 'rate', 'key_rate', 'key_concurrency',
  'concurrency', 'key_limits', 'keep_results_ms', 'events_ms', 'fairness')
local paused = config.paused == true
local out = {now, -1, -1, '', now + lease_ms, now_us, 0, 0, paused and 1 or 0, ''}

-- The rate: how many more claims the window allows (nil: no rate).
local rate_n, rate_per = nil, nil
if config.rate then rate_n, rate_per = config.rate[1], config.rate[2] end
local rate_left = nil
local rate_in_window = 0
if rate_n then
  rate_in_window = rate_window(KEYS[9], KEYS[7], now - rate_per + 1)
  rate_left = math.max(rate_n - rate_in_window, 0)
  limit = math.min(limit, rate_left)
end

-- The concurrency cap (issue 29): lease at most as many as the cap leaves room for. The live
-- leases are counted in the leased ZSET (O(log N): ZCARD less the entries already expired).
local cap = config.concurrency
local cap_live = 0
if cap then
  cap_live = redis.call('ZCARD', KEYS[2]) - redis.call('ZCOUNT', KEYS[2], '-inf', now)
  limit = math.min(limit, math.max(cap - cap_live, 0))
end

-- Per-key limits: most leased tasks per key, and the spacing of one key's claims in ms.
-- Named keys' overrides (config key_limit:<key>, issue 29) are read with the keys' states, only
-- when configure.lua counted some (key_limits > 0). Each slot's limits: conc[j], gaps[j] (false:
-- none), the queue's key_concurrency / key_gap (default_conc, default_gap) unless the key has
-- its own.
local overrides = (config.key_limits or 0) > 0
local conc, gaps = {}, {}
local default_conc = config.key_concurrency or false
local default_gap = config.key_rate and config.key_rate[2] / config.key_rate[1] or false

-- The leased count, rate mark and parked count of every key this claim looks at, read once
-- and written back once at the end. Each key gets a slot number the first time it is seen
-- (slot_of[key], slot_key[slot]); its state lives in arrays by slot (flight, marks, parked_n,
-- and changed: whether this claim changed it), so the lease loop does one hash lookup per task
-- and the rest are array reads (a claim over 1,000 new keys would otherwise grow five hash
-- tables keyed by key). key_fetch reads the state of the slots given since its last call with
-- one HMGET, or none when no key has any state (no key holds a lease, a rate mark or a parked
-- task: asked once, with EXISTS; this claim writes key states only at its end).
local slot_of, slot_key, flight, marks, parked_n, changed = {}, {}, {}, {}, {}, {}
local n_slots, n_fetched, any_state = 0, 0, nil
local function key_slot(key)
  local j = slot_of[key]
  if j == nil then
    n_slots = n_slots + 1
    j = n_slots
    slot_of[key], slot_key[j] = j, key
  end
  return j
end
local function key_fetch()
  if any_state == nil then any_state = redis.call('EXISTS', KEYS[10]) == 1 end
  for from = n_fetched + 1, n_slots, 4000 do
    local to = math.min(from + 3999, n_slots)
    local values = any_state and redis.call('HMGET', KEYS[10], unpack(slot_key, from, to)) or {}
    for j = from, to do
      local v = values[j - from + 1]
      if v then
        flight[j], marks[j], parked_n[j] = key_state_parse(v)
      else
        flight[j], marks[j], parked_n[j] = 0, 0, 0
      end
      changed[j] = false
      conc[j], gaps[j] = default_conc, default_gap
    end
    if overrides then
      local fields = {}
      for j = from, to do fields[j - from + 1] = 'key_limit:' .. slot_key[j] end
      local raws = redis.call('HMGET', KEYS[8], unpack(fields))
      for j = from, to do
        local raw = raws[j - from + 1]
        if raw then
          local v, ok = setting_parse(fields[j - from + 1], raw)
          if not ok then
            setting_refused(KEYS[8], KEYS[7], fields[j - from + 1], raw)
          else
            if v[1] then conc[j] = v[1] end
            if v[2] then gaps[j] = v[2][2] / v[2][1] end
          end
        end
      end
    end
  end
  n_fetched = n_slots
end

-- 2a. Keys whose wait is over: move as many of their parked tasks back to due as their limits
-- admit (at most UNPARK_KEYS keys per claim; the rest stay ready for the next claim).
local wait_head = head_score(KEYS[12])
if wait_head and wait_head <= now and not paused and limit > 0 then
  -- How many tasks of the key in slot j the limits admit now (at most `most`), and when the
  -- key's rate admits the next one if it admits none now.
  local function key_room(j, most)
    if conc[j] then most = math.min(most, conc[j] - flight[j]) end
    if most > 0 then
      if marks[j] > now then return 0, marks[j] end  -- its rate's next slot, or a cooldown
      if gaps[j] then most = math.min(most, 1) end
    end
    return math.max(most, 0), nil
  end

  local UNPARK_KEYS = 100
  local ready = redis.call('ZRANGEBYSCORE', KEYS[12], '-inf', now, 'LIMIT', 0, UNPARK_KEYS)
  for _, key in ipairs(ready) do key_slot(key) end
  key_fetch()
  for _, key in ipairs(ready) do
    local j = slot_of[key]
    local room, wait_until = key_room(j, limit)
    local moved = 0
    if room > 0 then
      local members = redis.call('ZRANGEBYLEX', KEYS[11], '[' .. key .. '\0', '(' .. key .. '\1',
        'LIMIT', 0, room)
      for _, member in ipairs(members) do
        local priority, due_ms, id = parked_parse(member, key)
        redis.call('ZREM', KEYS[11], member)
        if priority then redis.call('ZADD', levels[priority], due_ms, id) end
        moved = moved + 1
      end
    end
    local left = parked_n[j] - moved
    changed[j] = true
    if left <= 0 or moved < room then  -- none left (or the count was wrong): done waiting
      parked_n[j] = 0
      redis.call('ZREM', KEYS[12], key)
    else
      parked_n[j] = left
      if wait_until then
        redis.call('ZADD', KEYS[12], wait_until, key)  -- its rate's next slot
      elseif gaps[j] then
        redis.call('ZADD', KEYS[12], now + gaps[j], key)  -- after the slot just given out
      elseif conc[j] then
        redis.call('ZREM', KEYS[12], key)  -- until one of its leases ends (key_unlease)
      end  -- no limit any more: ready again at once
    end
  end
end

-- Park a due task (taken out of its level) whose key is at a limit; the writes are batched
-- after the loop.
local parked_here = 0
local park_members, park_meta, park_wait = {}, {}, {}
local function park(key, j, priority, due_ms, id, attempt, first, wait_until)
  park_members[#park_members + 1] = 0
  park_members[#park_members + 1] = parked_member(key, priority, due_ms, id)
  park_meta[#park_meta + 1] = id
  park_meta[#park_meta + 1] = attempt .. '||' .. ms(due_ms) .. '|' .. first
  parked_n[j] = parked_n[j] + 1
  changed[j] = true
  if wait_until and (park_wait[key] == nil or wait_until < park_wait[key]) then
    park_wait[key] = wait_until
  end
  parked_here = parked_here + 1
end

-- 2b. Take due ids, highest priority first (each level earliest first), until `limit` are
-- leased. Parked tasks make room, so the loop takes more, parking at most PARK_BUDGET per claim
-- (each parked task is looked at again only when its key may proceed: amortised O(1)).
local PARK_BUDGET = 1000 + #too_late  -- the expired leases ended above are not its work
local buried_here = 0
local token = nil
local leased, meta, orphans = {}, {}, {}
-- out's rows start after its 10 head fields, two per lease: a lease's id is at n_leased + 9
-- once n_leased counts it; column holds out[10]'s entries, one per leased task
local n_leased, column = 0, {}
-- Text of the first-claim time and of each distinct due ms in this claim, formatted once (tasks
-- scheduled in bulk share their due ms).
local now_text, due_texts = ms(now), {}
local due_ms_of, attempt_texts = {}, {}  -- score text -> due ms; attempt -> its text
-- the claim's deadline as text (include/claims.lua gives it when the first task is leased)
local deadline_text, token_mid = nil, nil
local n_meta = 0  -- meta's length: a first delivery first claimed now without a counted key
-- gets no meta value (its lease is fenced by the claim's unique deadline: include/claims.lua)
local upper_used = upper_levels_used(levels)
-- Fairness (include/fair.lua): due tasks go to their tenants' lanes first, and each round
-- takes from the lanes in fair order instead of from the levels (at most FAIR_ROUNDS rounds).
-- (This claim's fairness state is in the include's table, fair.run: claim.lua's main chunk is
-- near Lua's 200 locals.)
fair.run = {keys = {tasks = KEYS[3], meta = KEYS[4], parked = KEYS[11], fair = KEYS[30],
  config = KEYS[8], due = KEYS[31], claims = {KEYS[32], KEYS[33]}},
  on = config.fairness == 'key', rounds = 0, more = false}
if config.fairness == 'off' then fair.unlane(fair.run.keys, levels, fair.LANE_BUDGET) end
if fair.run.on then out[9] = out[9] + 2 end
if fair.run.on and not paused and limit > 0 then
  fair.lane(fair.run.keys, levels, fair.LANE_BUDGET, now, upper_used)
end
while not paused and #leased / 2 < limit and parked_here + #too_late < PARK_BUDGET do
  -- the due ids of this round, their scores, and (only when a level above 0 holds tasks, or
  -- on a fair queue) their priorities; the first level's reply is used as it is (no copy per
  -- task)
  local ids, scores, priorities, n_ids = {}, {}, {}, 0
  local by_priority = upper_used
  if fair.run.on then
    fair.run.rounds = fair.run.rounds + 1
    ids, scores, priorities, n_ids, fair.run.more = fair.take(fair.run.keys, limit - #leased / 2,
      now)
    by_priority = true
  end
  for p = upper_used and 9 or 0, 0, -1 do
    if fair.run.on then break end
    local room = limit - #leased / 2 - n_ids
    if room <= 0 then break end
    local due = redis.call('ZRANGEBYSCORE', levels[p], '-inf', now, 'LIMIT', 0, room)
    local got = #due
    if got > 0 then
      local due_scores = run_scores(levels[p], due)
      if n_ids == 0 then
        ids, scores = due, due_scores
        if upper_used then for i = 1, got do priorities[i] = p end end
      else
        for i = 1, got do
          ids[n_ids + i], scores[n_ids + i], priorities[n_ids + i] = due[i], due_scores[i], p
        end
      end
      n_ids = n_ids + got
      redis.call('ZREMRANGEBYRANK', levels[p], 0, got - 1)
    end
  end
  if n_ids == 0 then break end
  local parked_before = parked_here + #too_late
  local envelopes = redis.call('HMGET', KEYS[3], unpack(ids))
  -- (no meta hash: none of them was claimed before; nothing to ask for)
  local metas = redis.call('EXISTS', KEYS[4]) == 1 and redis.call('HMGET', KEYS[4], unpack(ids))
    or {}
  -- the slot of each task's limit key (false: none), and the first byte of each envelope
  -- (which says whether it has an options head: read once per task, one C call)
  local task_slots, heads = {}, {}
  for i = 1, n_ids do
    local envelope = envelopes[i]
    local b = envelope and string.byte(envelope, 1)
    heads[i] = b
    -- a task's key matters to this claim only when a key limit is set or some key has a state
    -- (a lease counted while it had a limit, a KeyCooldown's mark, parked tasks): else keyed
    -- tasks are leased as plain ones, not counted (include/key_state.lua)
    local key, j = nil, false
    if b == 50 or b == 51 then
      if any_state == nil then any_state = redis.call('EXISTS', KEYS[10]) == 1 end
      key = (default_conc or default_gap or overrides or any_state) and task_key(envelope)
    end
    if key then
      j = slot_of[key]
      if not j then  -- key_slot(key), inlined: a call per new key costs 1% of a keyed claim
        n_slots = n_slots + 1
        j = n_slots
        slot_of[key], slot_key[j] = j, key
      end
    end
    task_slots[i] = j
  end
  if n_slots > n_fetched then key_fetch() end
  for i = 1, n_ids do
    -- the due ms and its text, once per distinct score (tasks scheduled in bulk share one)
    local score = scores[i]
    local due_ms = due_ms_of[score]
    if not due_ms then
      due_ms = clamp_ms(score)
      due_ms_of[score] = due_ms
    end
    local id, meta_value, head = ids[i], metas[i], heads[i]
    local attempt, first, readable, _ = 0, '', true, nil  -- never claimed (no meta value)
    if meta_value then attempt, _, _, first, readable = meta_parse(meta_value) end
    local priority, j = by_priority and priorities[i] or 0, task_slots[i]
    local key = j and slot_key[j]
    local most = max_attempts
    if attempt > 0 and head == 50 then  -- its own max_attempts?
      local _, own = task_options(envelopes[i])
      most = own or max_attempts
    end
    local room, wait_until = 1, nil
    if j and readable and envelopes[i] then  -- key_room(j, 1), inlined: the hot path
      local kc = conc[j]
      if kc and flight[j] >= kc then
        room = 0
      elseif marks[j] > now then  -- its rate's next slot, or a cooldown
        room, wait_until = 0, marks[j]
      end
    end
    if not envelopes[i] then
      orphans[#orphans + 1] = id  -- a due entry without data (e.g. evicted): drop it
    elseif head == 51 and task_expired(envelopes[i], now) then
      too_late[#too_late + 1] = id  -- past its expiry: never started (tasks_expire below)
      if config.events_ms then outcome_events.note('expired', id, attempt, envelopes[i]) end
    elseif not readable then
      bury(id, 0, 'CorruptTask', 'its attempt record was unreadable: ' ..
        string.sub(tostring(metas[i]), 1, 100))
      buried_here = buried_here + 1
    elseif attempt >= most then
      bury(id, attempt, 'AttemptsExhausted', attempt .. ' attempt(s) made; max_attempts is ' ..
        most .. ' (lowered since it was scheduled)')
      buried_here = buried_here + 1
    elseif room < 1 then
      park(key, j, priority, due_ms, id, attempt, first, wait_until)
    else
      -- counted against its key only while the key has a limit (include/key_state.lua);
      -- from here j is the slot of the key it counts against, or false
      if j then
        if conc[j] or gaps[j] then
          flight[j] = flight[j] + 1
          local gap = gaps[j]
          if gap then
            local mark = marks[j]
            marks[j] = (mark > now and mark or now) + gap
          end
          changed[j] = true
        else
          j = false
        end
      end
      if not token then
        out[5], deadline_text, token = claims.issue(KEYS[34], now, lease_ms, holder)
        token_mid = '|' .. token .. '|'
      end
      attempt = attempt + 1
      if first == '' then first = now_text end
      local due_text = due_texts[due_ms]
      if not due_text then
        due_text = ms(due_ms)
        due_texts[due_ms] = due_text
      end
      -- texts made once per claim: a number in a concatenation or a command's arguments is
      -- formatted with sprintf each time
      local attempt_text = attempt_texts[attempt]
      if not attempt_text then
        attempt_text = ms(attempt)
        attempt_texts[attempt] = attempt_text
      end
      leased[n_leased + 1], leased[n_leased + 2] = deadline_text, id
      local first_now = attempt == 1 and first == now_text
      if j then  -- one concatenation either way (each makes a new string)
        meta[n_meta + 1] = id
        meta[n_meta + 2] = attempt_text .. token_mid .. due_text .. '|' .. first .. '|' .. key
        n_meta = n_meta + 2
      elseif not first_now or meta_value then  -- (a value left from before: rewritten)
        meta[n_meta + 1] = id
        meta[n_meta + 2] = attempt_text .. token_mid .. due_text .. '|' .. first
        n_meta = n_meta + 2
      end
      n_leased = n_leased + 2
      if first_now then
        column[n_leased / 2] = due_text
      else
        column[n_leased / 2] = due_text .. ',' .. attempt_text .. ',' .. first
      end
      out[n_leased + 9], out[n_leased + 10] = id, envelopes[i]
    end
  end
  -- none stepped aside (and no lane ran short): no more
  if parked_here + #too_late == parked_before and not fair.run.more then break end
  if fair.run.rounds >= 8 then break end  -- a fair claim's rounds are bounded
end
-- Write back the keys this claim changed (one HSET, one HDEL).
-- Keys leased once here share their new state (1, the same mark, 0 parked): the last state
-- made is reused while the next key's is the same.
do
  local state_set, state_drop, n_set, n_drop = {}, {}, 0, 0
  local last_f, last_m, last_p, last_v = nil, nil, nil, nil
  for j = 1, n_slots do
    if changed[j] then
      local f, m, p = flight[j], marks[j], parked_n[j]
      local v = last_v
      if f ~= last_f or m ~= last_m or p ~= last_p then
        v = key_state_value(f, m, p, now)
        last_f, last_m, last_p, last_v = f, m, p, v
      end
      if v then
        state_set[n_set + 1], state_set[n_set + 2] = slot_key[j], v
        n_set = n_set + 2
      else
        n_drop = n_drop + 1
        state_drop[n_drop] = slot_key[j]
      end
    end
  end
  if n_set > 0 then hset_many(KEYS[10], state_set) end
  if n_drop > 0 then call_chunked('HDEL', KEYS[10], state_drop) end
end
if #park_members > 0 then
  zadd_many(KEYS[11], park_members)
  hset_many(KEYS[4], park_meta)
  local waits = {}
  for key, at in pairs(park_wait) do
    waits[#waits + 1] = at
    waits[#waits + 1] = key
  end
  if #waits > 0 then zadd_chunked(KEYS[12], 'LT', waits) end
end
if #leased > 0 then
  out[4] = token
  out[10] = table.concat(column, '|')
  zadd_many(KEYS[2], leased)
  if n_meta > 0 then hset_many(KEYS[4], meta) end
  stat_incr(KEYS[7], 'claimed', #leased / 2)
  if rate_n then  -- one entry for this claim (its token is unique), with its count
    local n = #leased / 2
    redis.call('ZADD', KEYS[9], now, n .. '*' .. token)
    stat_set(KEYS[7], 'rate_in_window', rate_in_window + n)
    rate_left = rate_left - n
    redis.call('PEXPIRE', KEYS[9], rate_per + 1000)
  end
end
for _, id in ipairs(orphans) do redis.call('HDEL', KEYS[4], id); redis.call('HDEL', KEYS[5], id) end
if #orphans > 0 then
  stat_incr(KEYS[7], 'dropped', #orphans)
  redis.log(redis.LOG_WARNING, '[dueq] ' .. #orphans .. ' due id(s) of ' .. KEYS[1] ..
    ' had no stored task (evicted or deleted by hand) and were dropped')
end
out[7] = #orphans
if died > 0 then
  stat_incr(KEYS[7], 'dead', died)
  trim_dead(KEYS[6], KEYS[3], KEYS[4], KEYS[5], now, tonumber(ARGV[6]), tonumber(ARGV[7]),
    KEYS[29])
  publish_ended(KEYS[16], buried)
  followups_start({debounce = KEYS[19], tasks = KEYS[3], meta = KEYS[4], errors = KEYS[5],
    stats = KEYS[7], dead = KEYS[6], steps = KEYS[29]}, levels, buried, now)
end
out[8] = buried_here
tasks_expire({tasks = KEYS[3], meta = KEYS[4], errors = KEYS[5], stats = KEYS[7],
  results = KEYS[17], finished = KEYS[18], ended = KEYS[16], debounce = KEYS[19], steps = KEYS[29]}, levels,
  too_late, now, config.keep_results_ms or 0)
do  -- their batches and waiting children
  local bk = links.batch_keys(KEYS[21], KEYS[22], KEYS[23], KEYS[24], levels, KEYS[3], KEYS[7],
    KEYS[25])
  local ak = links.after_keys(KEYS[26], KEYS[27], KEYS[28], KEYS[6], KEYS[5], KEYS[16], bk)
  links.tasks_ended(bk, ak, buried, 'dead', now)
  links.tasks_ended(bk, ak, too_late, 'expired', now)
end

local next_due = levels_head(levels, not upper_used)
-- a fair queue's lanes hold due tasks only: the next claim can lease at once
if fair.run.on and redis.call('EXISTS', KEYS[30]) == 1 then next_due = now end
local key_wait = (wait_head or parked_here > 0) and head_score(KEYS[12])
if key_wait and (not next_due or key_wait < next_due) then next_due = key_wait end
local next_deadline = head_score(KEYS[2])
if next_due and not paused then
  out[2] = clamp_ms(next_due)
  if rate_left == 0 and next_due <= now then
    -- held back by the rate: the next claim can lease when the window's oldest claim leaves
    local oldest = redis.call('ZRANGE', KEYS[9], 0, 0, 'WITHSCORES')
    if oldest[2] then out[2] = math.max(out[2], tonumber(oldest[2]) + rate_per) end
  end
end
if next_deadline then out[3] = clamp_ms(next_deadline) end
-- At the concurrency cap: no claim can lease until a lease ends (a wake) or expires (out[3]).
if cap and cap_live + #leased / 2 >= cap then out[2] = -1 end
outcome_events.flush(KEYS[20], config.events_ms, now, ARGV[1])
return out
