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
-- KEYS[9] fair     ZSET tenant -> virtual time: a fair queue's tenants with due tasks (the
--                  first tasks of up to 100 of their lanes count for next_due: lanes_head)
-- KEYS[10] fair_due ZSET tenant -> tasks in its lane (include/fair.lua)
-- KEYS[11] fair_claims0 ZSET tenant -> tasks claimed from its lane in an even minute
-- KEYS[12] fair_claims1 ZSET the same, in an odd minute
-- KEYS[13..21] upper_due: the due ZSETs of priorities 1 to 9 (counted with KEYS[1])
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] how many tenants to report (the most due tasks, and the most claimed)
-- Returns {now, scheduled, due_now, leased, dead, next_due ms or -1, stored (tasks with data),
--          {setting1, value1, ...}, waiting, tenants, counter1, value1, ...}; tenants is
--          {tenants with due tasks, tasks claimed from lanes in this minute and the one
--          before, tenant1, its due tasks, its claimed tasks, ...} (empty fields on a queue
--          that never was fair)
-- @include clock
-- @include counters
-- @include epoch_ms
-- @include levels

-- The fair queue's tenants: the `most` with the most due tasks and the `most` with the most
-- claims in this minute and the one before, at `now` (stats.lua's reply).
local function fair_tenants(most, now)
  -- a queue that never was fair (or not for minutes) pays one EXISTS
  if redis.call('EXISTS', KEYS[10], KEYS[11], KEYS[12]) == 0 then
    return {redis.call('ZCARD', KEYS[9]), 0}
  end
  local minute = math.floor(now / 60000)
  local buckets = {}
  for _, k_bucket in ipairs({KEYS[11], KEYS[12]}) do
    local at = tonumber(redis.call('ZSCORE', k_bucket, '\0m'))
    if at == minute or at == minute - 1 then buckets[#buckets + 1] = k_bucket end
  end
  local total = 0
  local picked, order = {}, {}
  local function pick(tenant)
    if string.byte(tenant, 1) ~= 0 and not picked[tenant] then
      picked[tenant] = true
      order[#order + 1] = tenant
    end
  end
  for _, tenant in ipairs(redis.call('ZREVRANGE', KEYS[10], 0, most - 1)) do pick(tenant) end
  for _, k_bucket in ipairs(buckets) do
    total = total + (tonumber(redis.call('ZSCORE', k_bucket, '\0n')) or 0)
    for _, tenant in ipairs(redis.call('ZREVRANGE', k_bucket, 0, most + 1)) do pick(tenant) end
  end
  local out = {redis.call('ZCARD', KEYS[9]), total}
  for _, tenant in ipairs(order) do
    local claimed = 0
    for _, k_bucket in ipairs(buckets) do
      claimed = claimed + (tonumber(redis.call('ZSCORE', k_bucket, tenant)) or 0)
    end
    out[#out + 1] = tenant
    out[#out + 1] = tonumber(redis.call('ZSCORE', KEYS[10], tenant)) or 0
    out[#out + 1] = claimed
  end
  return out
end

-- The earliest due ms of a fair queue's laned tasks, or nil, as far as LANE_SAMPLE lanes show
-- it: the first member of the lanes of least and of most virtual time (a lane is ordered by
-- priority, then due: its first member is its oldest task of its highest priority). Lanes hold
-- every due task of a fair queue, so without this its oldest due task's wait would read 0.
local function lanes_head()
  local LANE_SAMPLE = 50
  if redis.call('EXISTS', KEYS[9]) == 0 then return nil end
  local seen, best = {}, nil
  for _, lanes in ipairs({redis.call('ZRANGE', KEYS[9], 0, LANE_SAMPLE - 1),
      redis.call('ZREVRANGE', KEYS[9], 0, LANE_SAMPLE - 1)}) do
    for _, tenant in ipairs(lanes) do
      if not seen[tenant] then
        seen[tenant] = true
        local prefix = '\1' .. tenant
        local first = redis.call('ZRANGEBYLEX', KEYS[7], '[' .. prefix .. '\0',
          '(' .. prefix .. '\1', 'LIMIT', 0, 1)[1]
        local due = first and tonumber(string.sub(first, #prefix + 3, #prefix + 17))
        if due and (not best or due < best) then best = due end
      end
    end
  end
  return best
end

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
  fair_tenants(tonumber(ARGV[2]) or 10, now),
}
local head = levels_head(levels)
local laned = lanes_head()
if laned and (not head or laned < head) then head = laned end
if head then out[6] = clamp_ms(head) end
local counters = redis.pcall('HGETALL', KEYS[4])
if counters.err then  -- not a hash (see stats_key_unusable in include/counters.lua): no counters
  stats_key_unusable(KEYS[4])
  counters = {}
end
for _, v in ipairs(counters) do out[#out + 1] = v end
return out
