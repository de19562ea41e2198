-- schedule.lua: add tasks to a queue; an id that exists in any state is left alone unless replace.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] tasks    HASH id -> envelope
-- KEYS[3] meta     HASH id -> "attempt|token|due_ms"
-- KEYS[4] errors   HASH id -> JSON list of error records
-- KEYS[5] leased   ZSET id -> lease deadline ms
-- KEYS[6] dead     ZSET id -> died-at ms
-- KEYS[7] stats    HASH counter -> int
-- KEYS[8] wake     Pub/Sub channel, told when the earliest due time moves earlier
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] "1" to replace existing tasks (payload, due time, attempts, errors; a live lease is
--         revoked), "0" to keep them
-- ARGV[3..] triples: id, due ("+<delay ms>" relative to now, or "<epoch ms>"), payload JSON
-- Returns {added, existing, replaced}

local now = dueq_now(ARGV[1])
local replace = ARGV[2] == '1'
local previous_head = head_score(KEYS[1])
local added, existing, replaced = 0, 0, 0
local zadd = {}
local earliest = nil
local stamp_prefix = '{"v":1,"c":' .. ms(now) .. ',"p":'

for i = 3, #ARGV, 3 do
  local id, due_spec = ARGV[i], ARGV[i + 1]
  local due
  if string.sub(due_spec, 1, 1) == '+' then
    due = now + tonumber(string.sub(due_spec, 2))
  else
    due = tonumber(due_spec)
  end
  local envelope = stamp_prefix .. ARGV[i + 2] .. '}'
  local write = false
  if redis.call('HSETNX', KEYS[2], id, envelope) == 1 then
    added = added + 1
    write = true
  elseif replace then
    redis.call('ZREM', KEYS[5], id)
    redis.call('ZREM', KEYS[6], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HSET', KEYS[2], id, envelope)
    replaced = replaced + 1
    write = true
  else
    existing = existing + 1
  end
  if write then
    zadd[#zadd + 1] = due
    zadd[#zadd + 1] = id
    if earliest == nil or due < earliest then earliest = due end
  end
end

if #zadd > 0 then
  call_chunked('ZADD', KEYS[1], zadd)
  redis.call('HINCRBY', KEYS[7], 'scheduled', added + replaced)
  wake_if_earlier(KEYS[8], previous_head, earliest)
end
return {added, existing, replaced}
