-- configure.lua: change a queue's settings (the config hash every script reads), atomically.
--
-- KEYS[1] config   HASH setting -> value (key_limits: the count of key_limit:<key> fields,
--                  kept here)
-- KEYS[2] wake     Pub/Sub channel: consumers claim at once after a change (resume, say)
-- KEYS[3] stats    HASH: the field "rejected:<setting>" of a setting changed here is dropped
--                  (the last refused value logged; see the prelude's settings)
-- ARGV[1], ARGV[2], ... pairs: setting, value; an empty value removes the setting (its
--         default applies)
-- Returns {refused, setting1, value1, ...}: the settings after the change; refused is 0, or
--         the number of key_limit:<key> settings the change would have left when that is more
--         than SETTING_MAX_KEY_LIMITS (then nothing is written)

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
if #ARGV > 0 then publish_wake(KEYS[2], 'configure') end
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, 0)
return out
