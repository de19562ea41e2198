-- cron_advance.lua: cron occurrences were claimed; for each that is its definition's pending
-- occurrence, move the schedule on (compare-and-set, so only one claimer advances a slot).
--
-- KEYS[1] cron_state  HASH name -> "head_ms|last_ms|head_id"
-- KEYS[2] due         ZSET id -> due ms
-- KEYS[3] tasks       HASH id -> envelope
-- KEYS[4] meta        HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[5] errors      HASH id -> JSON list of error records
-- KEYS[6] leased      ZSET id -> lease deadline ms
-- KEYS[7] stats       HASH counter -> int
-- KEYS[8] wake        Pub/Sub channel, told when the earliest due time moves earlier
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2..] one entry per claimed occurrence, each:
--         name, slot ms (advance only if it is the pending one), occurrence id, lease token,
--         "1" to drop the occurrence (a missed slot that must not run) or "0" to run it,
--         envelope for the occurrences it adds, next pending slot ms, next pending id,
--         count of missed occurrences to run now, then that many pairs: slot ms, id
-- Returns one status per entry: 1 if the schedule advanced, 0 if the slot was not the pending
--         one (then only the last fired slot is updated, and nothing is dropped)

local now = dueq_now(ARGV[1])
local previous_head = head_score(KEYS[2])
local earliest = nil
local out = {}

local function add(id, envelope, due_text)
  local due = tonumber(due_text)
  if add_task(KEYS[3], KEYS[2], KEYS[7], id, envelope, due) then
    if earliest == nil or due < earliest then earliest = due end
  end
end

local i = 2
while i <= #ARGV do
  local name, slot, id, token = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local drop, envelope, next_ms, next_id = ARGV[i + 4] == '1', ARGV[i + 5], ARGV[i + 6], ARGV[i + 7]
  local missed = tonumber(ARGV[i + 8])
  local first_missed = i + 9
  i = first_missed + 2 * missed

  local state = redis.call('HGET', KEYS[1], name)
  local head, last, head_id = cron_state_parse(state)
  local function fired(ms_text)
    if last == '' or tonumber(ms_text) > tonumber(last) then last = ms_text end
  end
  if not state then
    out[#out + 1] = 0
  elseif head ~= slot then
    fired(slot)
    redis.call('HSET', KEYS[1], name, head .. '|' .. last .. '|' .. head_id)
    out[#out + 1] = 0
  else
    if not drop then
      fired(slot)
    elseif lease_held(KEYS[6], KEYS[4], id, token, now) then
      redis.call('ZREM', KEYS[6], id)
      forget(KEYS[3], KEYS[4], KEYS[5], id)
      redis.call('HINCRBY', KEYS[7], 'cron_skipped', 1)
    end
    for j = first_missed, i - 1, 2 do add(ARGV[j + 1], envelope, ARGV[j]) end
    add(next_id, envelope, next_ms)
    redis.call('HSET', KEYS[1], name, next_ms .. '|' .. last .. '|' .. next_id)
    out[#out + 1] = 1
  end
end
if earliest then wake_if_earlier(KEYS[8], previous_head, earliest) end
return out
