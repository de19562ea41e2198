-- configure.lua: change a queue's settings (the config hash every script reads), atomically.
--
-- KEYS[1] config   HASH setting -> value (key_limits: the count of key_limit:<key> fields,
--                  kept here)
-- KEYS[2] wake     Pub/Sub channel: consumers claim at once after a change (resume, say)
-- KEYS[3] stats    HASH: the field "rejected:<setting>" of a setting changed here is dropped
--                  (the last refused value logged; see include/settings.lua)
-- KEYS[4] leased   ZSET id -> lease deadline ms
-- KEYS[5] meta     HASH id -> "attempt|token|due_ms|first_ms[|<key>]"
-- KEYS[6] tasks    HASH id -> envelope (its limit key)
-- KEYS[7] key_state HASH key -> "leased|mark|parked" (include/key_state.lua)
-- KEYS[8] claims   ZSET one record per claim (include/claims.lua: a first lease's meta value,
--                  written here when its lease is counted)
-- ARGV[1], ARGV[2], ... pairs: setting, value; an empty value removes the setting (its
--         default applies)
-- Returns {refused, setting1, value1, ...}: the settings after the change; refused is 0, or
--         the number of key_limit:<key> settings the change would have left when that is more
--         than SETTING_MAX_KEY_LIMITS (then nothing is written)
-- @include bulk
-- @include chunked
-- @include claims
-- @include counters
-- @include levels
-- @include meta
-- @include settings
-- @include wake

-- The bound on named key limits (issue 29): counted only when this change adds one.
local adding = 0
for i = 1, #ARGV, 2 do
  if ARGV[i + 1] ~= '' and string.sub(ARGV[i], 1, 10) == 'key_limit:'
      and redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then
    adding = adding + 1
  end
end
if adding > 0 then
  local n = adding
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 10) == 'key_limit:' then n = n + 1 end
  end
  for i = 1, #ARGV, 2 do  -- removals in the same change make room
    if ARGV[i + 1] == '' and string.sub(ARGV[i], 1, 10) == 'key_limit:'
        and redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
      n = n - 1
    end
  end
  if n > SETTING_MAX_KEY_LIMITS then
    local out = redis.call('HGETALL', KEYS[1])
    table.insert(out, 1, n)
    return out
  end
end

for i = 1, #ARGV, 2 do
  local r = redis.pcall('HDEL', KEYS[3], 'rejected:' .. ARGV[i])
  if type(r) == 'table' and r.err then stats_key_unusable(KEYS[3]) end
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
-- The count of key_limit:<key> settings, kept in key_limits for claim.lua (bounded: <= 1,000
-- fields, and a change of key limits is rare).
local touched = false
for i = 1, #ARGV, 2 do
  if string.sub(ARGV[i], 1, 10) == 'key_limit:' then touched = true end
end
if touched then
  local n = 0
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 10) == 'key_limit:' then n = n + 1 end
  end
  if n > 0 then redis.call('HSET', KEYS[1], 'key_limits', n) else
    redis.call('HDEL', KEYS[1], 'key_limits')
  end
end
-- Leases nobody counted: claim.lua counts a lease against its key only while the key has a
-- limit (include/key_state.lua), so a change of key limits counts the live leases of
-- every key that has a limit after it and whose leases were not counted: each such lease's meta
-- gets "|<key>" and its key's leased count one more, so the limit holds from this change on.
-- O(live leases), on a change of key_concurrency, key_rate or a key_limit:<key> only.
local limits_touched = false
for i = 1, #ARGV, 2 do
  local f = ARGV[i]
  if f == 'key_concurrency' or f == 'key_rate' or string.sub(f, 1, 10) == 'key_limit:' then
    limits_touched = true
  end
end
if limits_touched then
  local defaults = settings_read(KEYS[1], KEYS[3], 'key_concurrency', 'key_rate')
  local any_default = defaults.key_concurrency or defaults.key_rate
  local named = {}  -- key -> whether its own key_limit:<key> gives it a limit
  local function limited(key)
    if any_default then return true end
    local has = named[key]
    if has == nil then
      local field = 'key_limit:' .. key
      local raw = redis.call('HGET', KEYS[1], field)
      local v = raw and setting_parse(field, raw)
      has = v and (v[1] or v[2]) and true or false
      named[key] = has
    end
    return has
  end
  local ids = redis.call('ZRANGE', KEYS[4], 0, -1)
  local counts, order, metas_set = {}, {}, {}
  if #ids > 0 then
    local metas, envelopes = hmget_chunked(KEYS[5], ids), hmget_chunked(KEYS[6], ids)
    for i = 1, #ids do
      if not metas[i] then  -- a first lease: the value its claim's record gives
        metas[i] = claims.meta(KEYS[8], redis.call('ZSCORE', KEYS[4], ids[i]))
      end
      local _, token, _, _, readable, counted = meta_parse(metas[i])
      local key = readable and token ~= '' and not counted and task_key(envelopes[i] or nil)
      if key and limited(key) then
        metas_set[#metas_set + 1] = ids[i]
        metas_set[#metas_set + 1] = metas[i] .. '|' .. key
        if not counts[key] then order[#order + 1] = key end
        counts[key] = (counts[key] or 0) + 1
      end
    end
  end
  if #order > 0 then
    hset_many(KEYS[5], metas_set)
    local states = hmget_chunked(KEYS[7], order)
    local values = {}
    for i, key in ipairs(order) do
      -- the stored mark is kept as it is (this script has no queue clock to judge it by)
      local leased, mark, parked = string.match(states[i] or '', '^(%d+)|([%d.]*)|(%d+)$')
      values[#values + 1] = key
      values[#values + 1] = (tonumber(leased) or 0) + counts[key] .. '|' .. (mark or '') ..
        '|' .. (parked or '0')
    end
    hset_many(KEYS[7], values)
  end
end
if #ARGV > 0 then publish_wake(KEYS[2], 'configure') end
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, 0)
return out
