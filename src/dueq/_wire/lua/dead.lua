-- dead.lua: replay (back to due now, attempts and errors reset) or purge dead tasks.
-- With ids the call is all-or-nothing: if any id is not dead, nothing changes.
--
-- KEYS[1] dead     ZSET id -> died-at ms
-- KEYS[2] due      ZSET id -> due ms
-- KEYS[3] tasks    HASH id -> envelope
-- KEYS[4] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[5] errors   HASH id -> JSON list of error records
-- KEYS[6] stats    HASH counter -> int
-- KEYS[7] wake     Pub/Sub channel
-- KEYS[8] steps    HASH the durable tasks' state (include/steps.lua): dropped by a purge and
--                  by a replay from the start; a replay goes on from the first unfinished step
-- KEYS[9..17] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] "replay", "restart" (a replay from the first step: durable tasks forget their
--         steps and signals) or "purge"
-- ARGV[3] "ids" or "oldest"
-- ARGV[4..] the ids (with "ids"; a repeated id counts once), or the most to take, oldest first
--          (with "oldest")
-- Returns {count} on success, or {-1, missing_id1, ...} when some ids are not dead
-- @include bulk
-- @include chunked
-- @include clock
-- @include levels
-- @include stats
-- @include steps
-- @include wake

local now = dueq_now(ARGV[1])
local ids = {}
if ARGV[3] == 'ids' then
  local seen = {}
  for i = 4, #ARGV do
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      ids[#ids + 1] = ARGV[i]
    end
  end
  if #ids == 0 then return {0} end
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(ids))
  local missing = {-1}
  for i, id in ipairs(ids) do
    if not scores[i] then missing[#missing + 1] = id end
  end
  if #missing > 1 then return missing end
else
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)
  if #ids == 0 then return {0} end
end

call_chunked('ZREM', KEYS[1], ids)
call_chunked('HDEL', KEYS[4], ids)
call_chunked('HDEL', KEYS[5], ids)
if ARGV[2] ~= 'replay' then steps_forget(KEYS[8], ids) end
if ARGV[2] ~= 'purge' then
  local levels = due_levels(KEYS[2])
  local previous_head = levels_head(levels)
  local envelopes = {}
  for i = 1, #ids, 1000 do
    local part = redis.call('HMGET', KEYS[3], unpack(ids, i, math.min(i + 999, #ids)))
    for _, e in ipairs(part) do envelopes[#envelopes + 1] = e end
  end
  local by_level = {}
  for i, id in ipairs(ids) do
    local p = task_options(envelopes[i])
    by_level[p] = by_level[p] or {}
    table.insert(by_level[p], id)
  end
  for p, level_ids in pairs(by_level) do zadd_all(levels[p], now, level_ids) end
  stat_incr(KEYS[6], 'replayed', #ids)
  wake_if_earlier(KEYS[7], previous_head, now)
else
  call_chunked('HDEL', KEYS[3], ids)
  stat_incr(KEYS[6], 'purged', #ids)
end
return {#ids}
