-- configure.lua: change a queue's settings (the config hash every script reads), atomically.
--
-- KEYS[1] config   HASH setting -> value
-- KEYS[2] wake     Pub/Sub channel: consumers claim at once after a change (resume, say)
-- KEYS[3] stats    HASH: the field "rejected:<setting>" of a setting changed here is dropped
--                  (the last refused value logged; see the prelude's settings)
-- ARGV[1], ARGV[2], ... pairs: setting, value; an empty value removes the setting (its
--         default applies)
-- Returns the settings after the change: {setting1, value1, ...}

for i = 1, #ARGV, 2 do
  local r = redis.pcall('HDEL', KEYS[3], 'rejected:' .. ARGV[i])
  if type(r) == 'table' and r.err then stats_key_unusable(KEYS[3]) end
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
if #ARGV > 0 then publish_wake(KEYS[2], 'configure') end
return redis.call('HGETALL', KEYS[1])
