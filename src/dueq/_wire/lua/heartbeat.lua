-- heartbeat.lua: one beat of a worker process in the queue's worker registry, or its leaving.
-- Cost: O(log W) per beat, plus O(log W) per stale entry pruned (at most 100 per beat).
--
-- KEYS[1] workers       ZSET worker id -> ms its entry expires (last beat + ttl)
-- KEYS[2] workers_info  HASH worker id -> JSON entry, "last_seen_ms" first (see dueq.registry)
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] worker id
-- ARGV[3] "beat" (write the entry) or "leave" (remove it)
-- ARGV[4] the entry: a JSON object without "last_seen_ms", which this script adds
-- ARGV[5] ttl ms: how long the entry lives without another beat
-- Returns the number of live entries after the change
--
-- Stale entries (their process died without leaving) are pruned here, so the registry stays
-- as big as the live workers; both keys also get a TTL of at least the longest entry's, so a
-- registry nobody beats into any more disappears by itself. A reader never shows an entry past
-- its expiry (dueq.registry filters by the score), pruned or not.
-- @include clock

local now = dueq_now(ARGV[1])
local id, ttl_ms = ARGV[2], tonumber(ARGV[5])

-- A registry key of another type (written by hand) is dropped: the registry holds nothing
-- that the next beats do not write again.
local function keep_only(key, kind)
  local found = redis.call('TYPE', key)['ok']
  if found ~= kind and found ~= 'none' then
    redis.log(redis.LOG_WARNING, '[dueq] ' .. key .. ' was a ' .. found .. '; dropped')
    redis.call('DEL', key)
  end
end
keep_only(KEYS[1], 'zset')
keep_only(KEYS[2], 'hash')

local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 100)
for _, old in ipairs(stale) do
  redis.call('ZREM', KEYS[1], old)
  redis.call('HDEL', KEYS[2], old)
end

if ARGV[3] == 'leave' then
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
else
  redis.call('ZADD', KEYS[1], now + ttl_ms, id)
  redis.call('HSET', KEYS[2], id, '{"last_seen_ms":' .. ms(now) .. ',' .. string.sub(ARGV[4], 2))
  for _, key in ipairs(KEYS) do
    if redis.call('PTTL', key) < ttl_ms then redis.call('PEXPIRE', key, ttl_ms) end
  end
end

-- Entries without a score (left by hand or half written) would never be pruned: drop them.
local live = redis.call('ZCARD', KEYS[1])
if redis.call('HLEN', KEYS[2]) > live then
  for _, other in ipairs(redis.call('HKEYS', KEYS[2])) do
    if not redis.call('ZSCORE', KEYS[1], other) then redis.call('HDEL', KEYS[2], other) end
  end
end
return live
