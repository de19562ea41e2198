-- lease_seq.lua (include): lease_seq_next, the sequence number of lease tokens (claim.lua).
-- @include clock
-- @include counters

-- The sequence number of the next lease token (claim.lua), as text: the stats field lease_seq
-- counts claims. One that is not a counter (corrupted) restarts above any count of claims (the
-- clock in microseconds), so a number is never issued twice. A stats key that is not a hash
-- is left alone: the number is then "t" and the server's TIME in microseconds (two script
-- calls never run in the same microsecond), so tokens still fence.
local function lease_seq_next(k_stats, now, now_us)
  local seq, wrong = try_incr(k_stats, 'lease_seq', 1)
  if seq then return ms(seq) end
  if wrong then
    stats_key_unusable(k_stats)
    local t = redis.call('TIME')
    return 't' .. t[1] .. string.format('%06d', tonumber(t[2]))
  end
  redis.log(redis.LOG_WARNING, '[dueq] lease_seq of ' .. k_stats .. ' was unreadable; restarted')
  local fresh = ms(now) .. string.format('%03d', now_us)
  redis.call('HSET', k_stats, 'lease_seq', fresh)
  return fresh
end
