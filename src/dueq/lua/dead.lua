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
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] "replay" or "purge"
-- ARGV[3] "ids" or "oldest"
-- ARGV[4..] the ids (with "ids"; a repeated id counts once), or the most to take, oldest first
--          (with "oldest")
-- Returns {count} on success, or {-1, missing_id1, ...} when some ids are not dead

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
if ARGV[2] == 'replay' then
  local previous_head = head_score(KEYS[2])
  zadd_all(KEYS[2], now, ids)
  stat_incr(KEYS[6], 'replayed', #ids)
  wake_if_earlier(KEYS[7], previous_head, now)
else
  call_chunked('HDEL', KEYS[3], ids)
  stat_incr(KEYS[6], 'purged', #ids)
end
return {#ids}
