-- stats.lua (include): the stats hash's counters (stat_incr) and their per-minute history.
-- @include clock
-- @include counters

-- History: per-minute counts of the counters in HISTORY_COUNTERS, kept for HISTORY_MINUTES in
-- one HASH (keys.py `history`): field "<minute>|<counter>" -> count, where minute is the queue
-- clock in whole minutes since the epoch, and field "last" -> the latest minute written. A
-- script that counts one of these counters calls history_use(its history key, ARGV[1]) first;
-- stat_incr then adds to the minute's bucket too. Cost per script call that counts: one HGET of
-- "last" and one HINCRBY per counter; once a minute the minutes leaving the window are deleted
-- (HDEL of 6 fields per minute passed, at most a day's worth: bounded). A clock that went back
-- writes into its (older) minute while that is still in the window.
local HISTORY_NAMES, history_use, stat_incr
do
  local HISTORY_COUNTERS = {scheduled = true, claimed = true, acked = true, retried = true,
    dead = true, expired = true}
  HISTORY_NAMES = {'scheduled', 'claimed', 'acked', 'retried', 'dead', 'expired'}
  local HISTORY_MINUTES = 1440
  local history = nil

  function history_use(k_history, now_arg)
    history = {key = k_history, arg = now_arg}
  end

  -- The minute to count into (nil: outside the window), moving the window on when the clock has.
  local function history_minute()
    local h = history
    if h.minute ~= nil then return h.minute or nil end
    local k_history = h.key
    local minute = math.floor(dueq_now(h.arg) / 60000)
    local got = redis.pcall('HGET', k_history, 'last')
    if type(got) == 'table' then  -- not a hash: no history this call
      stats_key_unusable(k_history)
      h.minute = false
      return nil
    end
    local last = tonumber(got)
    if not last or last ~= math.floor(last) or minute - last >= HISTORY_MINUTES then
      redis.call('DEL', k_history)  -- nothing left in the window (or unreadable): start afresh
      redis.call('HSET', k_history, 'last', minute)
    elseif minute > last then
      local gone = {}
      for m = last - HISTORY_MINUTES + 1, minute - HISTORY_MINUTES do
        for _, name in ipairs(HISTORY_NAMES) do gone[#gone + 1] = m .. '|' .. name end
      end
      for i = 1, #gone, 4000 do
        redis.call('HDEL', k_history, unpack(gone, i, math.min(i + 3999, #gone)))
      end
      redis.call('HSET', k_history, 'last', minute)
    elseif minute <= last - HISTORY_MINUTES then
      minute = false  -- older than the window: not kept
    end
    h.minute = minute
    return minute or nil
  end

  local function history_add(field, n)
    local minute = history_minute()
    if not minute then return end
    local k_history, bucket = history.key, minute .. '|' .. field
    local v, wrong = try_incr(k_history, bucket, n)
    if not v and not wrong then redis.call('HSET', k_history, bucket, n) end
  end

  -- Add n to a counter of the stats hash (and to its minute's bucket, see history_use). A counter
  -- that is not an integer Redis can increment (a plain HINCRBY would fail after earlier writes)
  -- is logged and restarted at n; a stats key that is not a hash is left alone (see
  -- stats_key_unusable).
  function stat_incr(k_stats, field, n)
    if history and HISTORY_COUNTERS[field] then history_add(field, n) end
    local v, wrong = try_incr(k_stats, field, n)
    if v then return v end
    if wrong then
      stats_key_unusable(k_stats)
      return n
    end
    redis.log(redis.LOG_WARNING, '[dueq] counter ' .. field .. ' of ' .. k_stats ..
      ' was not an integer; restarted')
    redis.call('HSET', k_stats, field, n)
    return n
  end
end
