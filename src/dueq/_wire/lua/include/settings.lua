-- settings.lua (include): the queue's settings (the config hash), read and checked.
-- @include counters

-- Settings: the queue's config hash (configure.lua writes it). Every script reads and checks
-- its settings before its first write. Accepted values (dueq._wire.snapshot.setting_value is the same
-- rule in Python, with the bounds in dueq.model; tests/wire/test_config_validation.py feeds both the
-- same strings):
--   paused            "1" (paused) or "0" (running)
--   rate, key_rate    "<n>/<per_ms>": n in 1..SETTING_MAX_RATE_N, per_ms in 1..SETTING_MAX_PER_MS
--   key_concurrency   1..SETTING_MAX_KEY_CONCURRENCY
--   remember_done_ms  0..SETTING_MAX_WINDOW_MS
--   keep_results_ms   0..SETTING_MAX_WINDOW_MS
--   events_ms         0..SETTING_MAX_WINDOW_MS: how long outcome events are kept (0: none written)
--   concurrency       1..SETTING_MAX_CONCURRENCY: most live leases of the queue (claim.lua)
--   key_limit:<key>   "<concurrency>|<n>/<per_ms>", either part empty (not both): the limits
--                     of one named key, over key_concurrency / key_rate (claim.lua)
--   fairness          "key" (claims shared between tenants, include/fair.lua) or "off" (turned
--                     off while lanes remain: claims move them back to the levels)
--   key_limits        0..SETTING_MAX_KEY_LIMITS: how many key_limit:<key> settings there are,
--                     kept by configure.lua; claim.lua reads key_limit:<key> only when > 0
-- Numbers are ASCII digits only, at most 15 of them (exact as Lua numbers). Any other value
-- is refused: the script runs as if the setting were unset, and Redis logs the refused value
-- once (the stats field "rejected:<field>" remembers the last one logged; configure.lua drops
-- it when the setting is changed).
local SETTING_MAX_KEY_LIMITS, setting_parse, setting_refused, settings_read, done_window
do
  local SETTING_MAX_RATE_N = 1000000
  local SETTING_MAX_PER_MS = 31622400000  -- 366 days
  local SETTING_MAX_KEY_CONCURRENCY = 1000000
  local SETTING_MAX_WINDOW_MS = 31622400000  -- 366 days
  local SETTING_MAX_CONCURRENCY = 1000000
  SETTING_MAX_KEY_LIMITS = 1000  -- most key_limit:<key> settings (configure.lua)
  local SETTING_SHOWN = 100  -- bytes of a refused value logged and remembered

  local function setting_whole(s, low, high)
    if not s or #s > 15 or not string.match(s, '^%d+$') then return nil end
    local n = tonumber(s)
    if n < low or n > high then return nil end
    return n
  end

  -- A setting's value as the scripts use it (paused: a boolean; a rate: {n, per_ms}; else a
  -- number), and whether it was accepted. A field without a rule is passed through.
  function setting_parse(field, raw)
    local v = nil
    if field == 'paused' then
      if raw == '1' or raw == '0' then return raw == '1', true end
    elseif field == 'rate' or field == 'key_rate' then
      local n, per = string.match(raw, '^(%d+)/(%d+)$')
      n, per = setting_whole(n, 1, SETTING_MAX_RATE_N), setting_whole(per, 1, SETTING_MAX_PER_MS)
      if n and per then v = {n, per} end
    elseif field == 'key_concurrency' then
      v = setting_whole(raw, 1, SETTING_MAX_KEY_CONCURRENCY)
    elseif field == 'remember_done_ms' or field == 'keep_results_ms' or field == 'events_ms' then
      v = setting_whole(raw, 0, SETTING_MAX_WINDOW_MS)
    elseif field == 'concurrency' then
      v = setting_whole(raw, 1, SETTING_MAX_CONCURRENCY)
    elseif field == 'fairness' then
      if raw == 'key' or raw == 'off' then v = raw end
    elseif field == 'key_limits' then
      v = setting_whole(raw, 0, SETTING_MAX_KEY_LIMITS)
    elseif string.sub(field, 1, 10) == 'key_limit:' then
      -- {concurrency or false, {n, per_ms} or false}
      local c, r = string.match(raw, '^(%d*)|(.*)$')
      if c then
        local conc, rate, ok = false, false, true
        if c ~= '' then
          conc = setting_whole(c, 1, SETTING_MAX_KEY_CONCURRENCY)
          ok = conc ~= nil
        end
        if r ~= '' then
          local n, per = string.match(r, '^(%d+)/(%d+)$')
          n, per = setting_whole(n, 1, SETTING_MAX_RATE_N),
            setting_whole(per, 1, SETTING_MAX_PER_MS)
          if n and per then rate = {n, per} else ok = false end
        end
        if ok and (conc or rate) then v = {conc, rate} end
      end
    else
      return raw, true
    end
    return v, v ~= nil
  end

  -- Log a refused setting unless the same value was logged before (after validation: the one
  -- write it makes is a statistics field, which never fails the script).
  function setting_refused(k_config, k_stats, field, raw)
    local shown = string.sub(raw, 1, SETTING_SHOWN)
    local marker = 'rejected:' .. field
    local seen = redis.pcall('HGET', k_stats, marker)
    if seen == shown then return end
    redis.log(redis.LOG_WARNING, '[dueq] setting ' .. field .. ' of ' .. k_config ..
      ' is not a value dueq can use: "' .. shown .. '"; ignored (as if unset) until it is changed')
    stat_set(k_stats, marker, shown)
  end

  -- The queue's settings `...` in one HMGET: a table field -> value as setting_parse reads it,
  -- without the fields that are unset or refused.
  function settings_read(k_config, k_stats, ...)
    local fields = {...}
    local values = redis.call('HMGET', k_config, unpack(fields))
    local out = {}
    for i, field in ipairs(fields) do
      local raw = values[i]
      if raw then
        local v, ok = setting_parse(field, raw)
        if ok then out[field] = v else setting_refused(k_config, k_stats, field, raw) end
      end
    end
    return out
  end

  -- The remember-done window ms: the queue's setting when it is set (and accepted), else the
  -- caller's (Queue(remember_done=...), deprecated); and the settings `...`, read in the same
  -- HMGET (settings_read's table).
  function done_window(k_config, k_stats, caller_ms, ...)
    local settings = settings_read(k_config, k_stats, 'remember_done_ms', ...)
    local v = settings.remember_done_ms
    if v ~= nil then return v, settings end
    return tonumber(caller_ms), settings
  end
end
