-- inspect.lua: read tasks with their state, as one consistent snapshot.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] dead     ZSET id -> died-at ms
-- KEYS[4] tasks    HASH id -> envelope
-- KEYS[5] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[6] errors   HASH id -> JSON list of error records
-- KEYS[7] parked  ZSET due tasks whose key was at a limit (see include/key_state.lua)
-- KEYS[8] results  HASH id -> finished record (see include/results.lua)
-- KEYS[9] waiting  ZSET id -> due ms: tasks waiting for parents (after=)
-- KEYS[10] steps   HASH the durable tasks' state: a task's step log (include/step_log.lua)
-- KEYS[11] claims  ZSET one record per claim (include/claims.lua: a first lease's meta value)
-- KEYS[12..20] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" (unused; kept for the common ARGV layout)
-- ARGV[2] "ids" (ARGV[3..] are ids) or "dead" (ARGV[3] offset, ARGV[4] count; newest first)
-- Returns a flat list of 7-tuples: id, state ("scheduled"|"leased"|"dead"|"done"|"cancelled"
--   |"expired"|"waiting"|""), score or "", envelope or "", meta or "", errors or "", step log or ""; a missing
--   task has state "". A finished task kept by keep_results ("done", "cancelled", "expired")
--   has its record's header JSON
--   in place of meta, and its finished ms as score. A scheduled durable task handed back to
--   wait for a signal (its log's open line a wait) is "waiting", its deadline as score
-- @include clock
-- @include levels
-- @include meta
-- @include parked
-- @include step_log

local ids = {}
if ARGV[2] == 'ids' then
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  local first = tonumber(ARGV[3])
  ids = redis.call('ZREVRANGE', KEYS[3], ms(first), ms(first + tonumber(ARGV[4]) - 1))
end

local levels = due_levels(KEYS[1])
local has_steps = redis.call('EXISTS', KEYS[10]) == 1
local out = {}
for _, id in ipairs(ids) do
  local state, score = '', nil
  local envelope = redis.call('HGET', KEYS[4], id)
  local k_level = level_key(levels, envelope)
  score = redis.call('ZSCORE', k_level, id)
  local priority, _, key = task_options(envelope)
  local member = envelope and not score and parked_member_of(KEYS[5], key, priority, id)
  if member and redis.call('ZSCORE', KEYS[7], member) then
    state = 'scheduled'  -- parked: due, waiting for its key's limits
    local _, _, due = meta_parse(redis.call('HGET', KEYS[5], id))
    score = due
  elseif score then
    state = 'scheduled'
  else
    score = redis.call('ZSCORE', KEYS[2], id)
    if score then
      state = 'leased'
    else
      score = redis.call('ZSCORE', KEYS[3], id)
      if score then state = 'dead' end
      if not score then
        score = redis.call('ZSCORE', KEYS[9], id)
        if score then state = 'waiting' end
      end
    end
  end
  local meta = nil
  if state == '' and not envelope then
    local record = redis.call('HGET', KEYS[8], id)
    local head, rest = nil, nil
    if record then head, rest = string.match(record, '^([^\n]*)\n(.*)$') end
    if head then
      state = string.match(head, '^{"state":"(%a+)"') or ''
      score = string.match(head, '"finished_ms":(%d+)')
      envelope, meta = rest, head
    end
  end
  out[#out + 1] = id
  out[#out + 1] = state
  out[#out + 1] = score or ''
  out[#out + 1] = envelope or ''
  if not meta and state == 'leased' then meta = meta_get(KEYS[5], KEYS[2], KEYS[11], id) end
  out[#out + 1] = meta or redis.call('HGET', KEYS[5], id) or ''
  out[#out + 1] = redis.call('HGET', KEYS[6], id) or ''
  local log = has_steps and redis.call('HGET', KEYS[10], id) or ''
  if state == 'scheduled' and log ~= '' then
    local _, open = step_log_scan(log)
    if open and string.sub(open, 1, 1) == 'W' then out[#out - 4] = 'waiting' end
  end
  out[#out + 1] = log
end
return out
