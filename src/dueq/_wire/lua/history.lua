-- history.lua: the per-minute counts of the last minutes, and how many tasks fall due in each
-- bucket ahead, as one snapshot. Cost: O(minutes * 6 + buckets * 10 * log N).
--
-- KEYS[1] history  HASH "<minute>|<counter>" -> count (see include/stats.lua; a key of another
--                  type reads as zero counts)
-- KEYS[2] due      ZSET id -> due ms
-- KEYS[3] parked   ZSET due tasks whose key was at a limit (all due now)
-- KEYS[4..12] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] minutes: how many minutes of history, ending with the current one (0..1440)
-- ARGV[3] bucket ms (>= 1) and ARGV[4] buckets (0..1000): the due-time histogram's shape
-- Returns {now, minutes * 6 counts (oldest minute first; per minute the counters in the
--          HISTORY_NAMES order of include/stats.lua), overdue (due at or before now, parked
--          included),
--          buckets counts (bucket i: due in (now + i * bucket, now + (i + 1) * bucket]),
--          later (due after the last bucket)}
-- @include chunked
-- @include clock
-- @include counters
-- @include levels
-- @include stats

local now = dueq_now(ARGV[1])
local minutes, bucket_ms, buckets = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {now}

local current = math.floor(now / 60000)
local kept = redis.call('TYPE', KEYS[1])
kept = kept.ok or kept
if kept ~= 'hash' and kept ~= 'none' then  -- see stats_key_unusable in include/counters.lua
  stats_key_unusable(KEYS[1])
  minutes = -minutes  -- no history: zero counts
end
if minutes < 0 then
  for _ = 1, -minutes * #HISTORY_NAMES do out[#out + 1] = 0 end
elseif minutes > 0 then
  local fields = {}
  for m = current - minutes + 1, current do
    for _, name in ipairs(HISTORY_NAMES) do fields[#fields + 1] = m .. '|' .. name end
  end
  for _, v in ipairs(hmget_chunked(KEYS[1], fields)) do out[#out + 1] = tonumber(v) or 0 end
end

local levels = due_levels(KEYS[2])
local used = {}
for p = 0, 9 do
  if p == 0 or redis.call('EXISTS', levels[p]) == 1 then used[#used + 1] = levels[p] end
end
local function due_between(lo, hi)
  local n = 0
  for _, key in ipairs(used) do n = n + redis.call('ZCOUNT', key, lo, hi) end
  return n
end
out[#out + 1] = due_between('-inf', now) + redis.call('ZCARD', KEYS[3])
for i = 0, buckets - 1 do
  out[#out + 1] = due_between('(' .. ms(now + i * bucket_ms), now + (i + 1) * bucket_ms)
end
out[#out + 1] = due_between('(' .. ms(now + buckets * bucket_ms), '+inf')
return out
