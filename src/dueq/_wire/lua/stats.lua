-- stats.lua: counts per state and timing of a queue, as one consistent snapshot.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] dead     ZSET id -> died-at ms
-- KEYS[4] stats    HASH counter -> int (a key of another type reads as no counters)
-- KEYS[5] tasks    HASH id -> envelope (only counted)
-- KEYS[6] config   HASH setting -> value
-- KEYS[7] parked  ZSET due tasks whose key was at a limit (counted as scheduled and due)
-- KEYS[8] waiting  ZSET id -> due ms: tasks waiting for parents (after=; only counted)
-- KEYS[9..17] upper_due: the due ZSETs of priorities 1 to 9 (counted with KEYS[1])
-- ARGV[1] now ms, or "" for server TIME
-- Returns {now, scheduled, due_now, leased, dead, next_due ms or -1, stored (tasks with data),
--          {setting1, value1, ...}, waiting, counter1, value1, ...}
-- @include clock
-- @include counters
-- @include epoch_ms
-- @include levels

local now = dueq_now(ARGV[1])
local levels = due_levels(KEYS[1])
local scheduled, due_now = 0, 0
for p = 0, 9 do
  scheduled = scheduled + redis.call('ZCARD', levels[p])
  due_now = due_now + redis.call('ZCOUNT', levels[p], '-inf', now)
end
local parked = redis.call('ZCARD', KEYS[7])
scheduled, due_now = scheduled + parked, due_now + parked
local out = {
  now,
  scheduled,
  due_now,
  redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]),
  -1,
  redis.call('HLEN', KEYS[5]),
  redis.call('HGETALL', KEYS[6]),
  redis.call('ZCARD', KEYS[8]),
}
local head = levels_head(levels)
if head then out[6] = clamp_ms(head) end
local counters = redis.pcall('HGETALL', KEYS[4])
if counters.err then  -- not a hash (see stats_key_unusable in include/counters.lua): no counters
  stats_key_unusable(KEYS[4])
  counters = {}
end
for _, v in ipairs(counters) do out[#out + 1] = v end
return out
