-- progress.lua: record one progress entry of a leased task, under its lease (d.progress).
--
-- KEYS[1] leased   ZSET id -> lease deadline ms
-- KEYS[2] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[3] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- KEYS[4] steps    HASH: field "<id>\0p" the task's recent progress, one entry a line
--                  "<seq>\t<ms>\t<JSON>" (lines joined by "\n", oldest first)
-- KEYS[5] config   HASH setting -> value (events_ms: see include/settings.lua)
-- KEYS[6] stats    HASH counter -> int (a refused setting is noted there)
-- KEYS[7] events   STREAM outcome events (a "progress" event, only when events_ms > 0)
-- KEYS[8] progress Pub/Sub channel: the entry, for followers (q.progress)
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] id
-- ARGV[3] lease token
-- ARGV[4] the entry's body: JSON text without a newline
-- ARGV[5] most entries kept in the task's history (the oldest dropped first)
-- Returns {verdict, seq, at ms}: verdict 'h' (held: written as entry seq, 1, 2, ... per task),
-- 'c' (its task was cancelled while leased) or 'l' (lease lost: expired, taken over, or the
-- task is gone); nothing is written unless 'h'. The message published is the id packed as
-- struct '>Hc0', then the entry's line.
-- @include clock
-- @include events
-- @include leases
-- @include meta
-- @include settings
-- @include wake

local now = dueq_now(ARGV[1])
local id, token, body = ARGV[2], ARGV[3], ARGV[4]
local verdict = lease_verdict(KEYS[1], KEYS[2], KEYS[3], id, token, now)
if verdict ~= 'h' then return {verdict, 0, now} end
if string.find(body, '\n', 1, true) then
  return redis.error_reply('ERR dueq progress: the body must be JSON without a newline')
end
local keep = math.max(tonumber(ARGV[5]) or 1, 1)
local settings = settings_read(KEYS[5], KEYS[6], 'events_ms')

local field = id .. '\0p'
local kept = redis.call('HGET', KEYS[4], field)
local lines = {}
if kept then
  for line in string.gmatch(kept, '[^\n]+') do lines[#lines + 1] = line end
end
-- the next seq: the last entry's + 1; a history that cannot be read (a hand edit) starts over
local seq = 1
if #lines > 0 then
  local last = tonumber(string.match(lines[#lines], '^(%d+)\t'))
  if last then seq = last + 1 else lines = {} end
end
local line = ms(seq) .. '\t' .. ms(now) .. '\t' .. body
lines[#lines + 1] = line
local first = math.max(#lines - keep + 1, 1)
redis.call('HSET', KEYS[4], field, table.concat(lines, '\n', first, #lines))

if settings.events_ms and settings.events_ms > 0 then
  -- (held: a first lease has no meta value, and is attempt 1)
  local v = redis.call('HGET', KEYS[2], id)
  local attempt = v and meta_parse(v) or 1
  outcome_events.note('progress', id, attempt, nil, nil, nil, {'seq', ms(seq), 'body', body})
  outcome_events.flush(KEYS[7], settings.events_ms, now, ARGV[1])
end
publish_wake(KEYS[8], struct.pack('>Hc0', #id, id) .. line)
return {'h', seq, now}
