-- cron_backfill.lua: schedule occurrences of chosen past (or future) slots of one definition,
-- once per slot: a slot backfilled before, or whose occurrence exists, is not added again.
--
-- KEYS[1] cron        HASH name -> definition JSON
-- KEYS[2] cron_filled ZSET (scores 0) "<name>\0<slot ms>": the slots ever backfilled
-- KEYS[3] due         ZSET id -> due ms
-- KEYS[4] tasks       HASH id -> envelope
-- KEYS[5] stats       HASH counter -> int
-- KEYS[6] wake        Pub/Sub channel, told when the earliest due time moves earlier
-- KEYS[7] history  HASH "<minute>|<counter>" -> count: per-minute counts (see include/stats.lua)
-- KEYS[8..16] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] name
-- ARGV[3] the definition JSON the caller planned from (compare-and-set)
-- ARGV[4] the envelope of the occurrences (a version-3 head's expiry is ms after the slot:
--         each occurrence counts it from when it is due, its slot or now if that is later, so
--         a backfilled past slot gets the whole of it; see cron_expiring in
--         include/cron_expiry.lua)
-- ARGV[5..] triples: slot ms, due ms (a past one is stored as now), occurrence id
-- Returns the count of occurrences added; -1 no definition of that name; -2 the definition is
--         no longer ARGV[3] (nothing changed, read it again).
--         An error (before any write) for a bad slot or due time.
-- @include clock
-- @include cron_expiry
-- @include cron_state
-- @include levels
-- @include stats
-- @include tasks
-- @include wake

for j = 5, #ARGV, 3 do
  if not ms_text_ok(ARGV[j], false) or not ms_text_ok(ARGV[j + 1] or '', false) then
    return redis.error_reply('ERR cron_backfill: bad slot')
  end
end
history_use(KEYS[7], ARGV[1])
local name = ARGV[2]
local current = redis.call('HGET', KEYS[1], name)
if not current then return -1 end
if current ~= ARGV[3] then return -2 end
local now = dueq_now(ARGV[1])
local levels = due_levels(KEYS[3])
local level = level_key(levels, ARGV[4])
local previous_head = levels_head(levels)
local added, earliest = 0, nil
for j = 5, #ARGV, 3 do
  if redis.call('ZADD', KEYS[2], 'NX', 0, name .. '\0' .. ARGV[j]) == 1 then
    local due = math.max(tonumber(ARGV[j + 1]), now)
    local envelope = cron_expiring(ARGV[4], nil, math.max(tonumber(ARGV[j]), now))
    if add_task(KEYS[4], level, KEYS[5], ARGV[j + 2], envelope, due) then
      added = added + 1
      if not earliest or due < earliest then earliest = due end
    end
  end
end
if earliest then wake_if_earlier(KEYS[6], previous_head, earliest) end
return added
