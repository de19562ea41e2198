-- cron_advance.lua: cron occurrences were claimed; for each that is its definition's pending
-- occurrence, move the schedule on (compare-and-set, so only one claimer advances a slot).
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
-- KEYS[10] cron_paused HASH name -> paused-at ms (any value: paused)
-- KEYS[11] history  HASH "<minute>|<counter>" -> count: per-minute counts (see the prelude)
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2..] one entry per claimed occurrence, each:
--         name, slot ms (advance only if it is the pending one), occurrence id, lease token,
--         "1" to drop the occurrence (a missed slot that must not run) or "0" to run it,
--         envelope for the occurrences it adds, next pending slot ms (after now), next pending
--         id, count of missed occurrences to run now, then that many pairs: slot ms, id
-- Returns one status per entry:
--          1 the schedule advanced;
--          0 the slot was not the pending one (only the last fired slot is updated, nothing is
--            dropped), or the definition is gone (nothing changes);
--          2 the state was missing or unreadable: it was rebuilt with the next pending slot
--            (after now, so no slot fires twice), the occurrence runs, no missed slot is added;
--         -1 the entry's numbers are out of range: nothing changed for it;
--          3 the definition is paused: the occurrence runs (also a missed slot), nothing is
--            scheduled, and the state keeps its pending slot (an unreadable one is rebuilt as
--            for 2, without adding the occurrence); resuming schedules from then on.
--         An error (before any write) if the entries are not laid out as above.

-- Pass 1: lay out and check every entry, writing nothing.
local entries = {}
local i = 2
while i <= #ARGV do
  if i + 8 > #ARGV then return redis.error_reply('ERR cron_advance: truncated entry') end
  local missed = tonumber(ARGV[i + 8])
  if not missed or missed < 0 or missed % 1 ~= 0 or i + 8 + 2 * missed > #ARGV then
    return redis.error_reply('ERR cron_advance: bad missed count')
  end
  local e = {
    name = ARGV[i], slot = ARGV[i + 1], id = ARGV[i + 2], token = ARGV[i + 3],
    drop = ARGV[i + 4] == '1', envelope = ARGV[i + 5], next_ms = ARGV[i + 6],
    next_id = ARGV[i + 7], first_missed = i + 9, last_missed = i + 8 + 2 * missed,
  }
  e.ok = ms_text_ok(e.slot, false) and ms_text_ok(e.next_ms, false)
  for j = e.first_missed, e.last_missed, 2 do
    e.ok = e.ok and ms_text_ok(ARGV[j], false)
  end
  entries[#entries + 1] = e
  i = e.last_missed + 1
end

-- Pass 2: carry the entries out; nothing below raises on what it reads.
local now = dueq_now(ARGV[1])
history_use(KEYS[11], ARGV[1])
local previous_head = head_score(KEYS[3])
local earliest = nil
local out = {}

local function add(id, envelope, due_text)
  local due = tonumber(due_text)
  if add_task(KEYS[4], KEYS[3], KEYS[8], id, envelope, due) then
    if earliest == nil or due < earliest then earliest = due end
  end
end

for _, e in ipairs(entries) do
  local head, last, head_id = cron_state_read(redis.call('HGET', KEYS[2], e.name), e.name)
  local function fired(ms_text)
    if last == '' or tonumber(ms_text) > tonumber(last) then last = ms_text end
  end
  local paused = e.ok and redis.call('HEXISTS', KEYS[10], e.name) == 1
  if not e.ok then
    out[#out + 1] = -1
  elseif not head then
    if redis.call('HEXISTS', KEYS[1], e.name) == 0 then
      out[#out + 1] = 0
    else
      if not paused then add(e.next_id, e.envelope, e.next_ms) end
      redis.call('HSET', KEYS[2], e.name, e.next_ms .. '|' .. e.slot .. '|' .. e.next_id)
      stat_incr(KEYS[8], 'cron_state_rebuilt', 1)
      out[#out + 1] = paused and 3 or 2
    end
  elseif paused or tonumber(head) ~= tonumber(e.slot) then
    -- Not the pending slot (a redelivery), or paused: it runs, and the schedule stays.
    fired(e.slot)
    redis.call('HSET', KEYS[2], e.name, head .. '|' .. last .. '|' .. head_id)
    out[#out + 1] = paused and 3 or 0
  else
    if not e.drop then
      fired(e.slot)
    elseif lease_held(KEYS[7], KEYS[5], e.id, e.token, now) then
      redis.call('ZREM', KEYS[7], e.id)
      forget(KEYS[4], KEYS[5], KEYS[6], e.id)
      stat_incr(KEYS[8], 'cron_skipped', 1)
    end
    for j = e.first_missed, e.last_missed, 2 do add(ARGV[j + 1], e.envelope, ARGV[j]) end
    add(e.next_id, e.envelope, e.next_ms)
    redis.call('HSET', KEYS[2], e.name, e.next_ms .. '|' .. last .. '|' .. e.next_id)
    out[#out + 1] = 1
  end
end
if earliest then wake_if_earlier(KEYS[9], previous_head, earliest) end
return out
