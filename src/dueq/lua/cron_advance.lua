-- cron_advance.lua: a cron occurrence was claimed; if it is its definition's pending
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
-- ARGV[2] name
-- ARGV[3] the claimed occurrence's slot ms (advance only if it is the pending one)
-- ARGV[4] the claimed occurrence's id
-- ARGV[5] its lease token
-- ARGV[6] "1" to drop the claimed occurrence (a missed slot that must not run), "0" to run it
-- ARGV[7] envelope of the occurrences to add
-- ARGV[8] next pending occurrence: due ms
-- ARGV[9] next pending occurrence: id
-- ARGV[10..] pairs: slot ms, id of missed occurrences to run now
-- Returns 1 if the schedule advanced, 0 if the slot was not the pending one (then only the
--         last fired slot is updated, and nothing is dropped)

local now = dueq_now(ARGV[1])
local name, slot = ARGV[2], ARGV[3]
local state = redis.call('HGET', KEYS[1], name)
local head, last, head_id = cron_state_parse(state)
if not state then return 0 end

local function fired(ms_text)
  if last == '' or tonumber(ms_text) > tonumber(last) then last = ms_text end
end

if head ~= slot then
  fired(slot)
  redis.call('HSET', KEYS[1], name, head .. '|' .. last .. '|' .. head_id)
  return 0
end

local id, token = ARGV[4], ARGV[5]
if ARGV[6] == '1' then
  if lease_held(KEYS[6], KEYS[4], id, token, now) then
    redis.call('ZREM', KEYS[6], id)
    forget(KEYS[3], KEYS[4], KEYS[5], id)
    redis.call('HINCRBY', KEYS[7], 'cron_skipped', 1)
  end
else
  fired(slot)
end

local previous_head = head_score(KEYS[2])
local earliest = nil
local envelope = ARGV[7]
for i = 10, #ARGV, 2 do
  if add_task(KEYS[3], KEYS[2], KEYS[7], ARGV[i + 1], envelope, tonumber(ARGV[i])) then
    if earliest == nil or tonumber(ARGV[i]) < earliest then earliest = tonumber(ARGV[i]) end
  end
end
local next_ms = tonumber(ARGV[8])
if add_task(KEYS[3], KEYS[2], KEYS[7], ARGV[9], envelope, next_ms) then
  if earliest == nil or next_ms < earliest then earliest = next_ms end
end
if earliest then wake_if_earlier(KEYS[8], previous_head, earliest) end
redis.call('HSET', KEYS[1], name, ARGV[8] .. '|' .. last .. '|' .. ARGV[9])
return 1
