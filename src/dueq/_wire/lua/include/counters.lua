-- counters.lua (include): statistics fields that never stop a script.

-- Statistics (the stats hash's counters other than lease_seq, the per-minute history) are
-- never worth stopping a script for: a statistics key that holds another type than a hash
-- (written by something other than dueq) is left alone, logged once per script call, and its
-- numbers are not kept until an operator deletes it. Every other key is essential: a wrong
-- type there raises WRONGTYPE, which dueq's script runner (scripts.py) names as CorruptQueue.
local stats_key_unusable
do
  local unusable_logged = {}
  function stats_key_unusable(key)
    if unusable_logged[key] then return end
    unusable_logged[key] = true
    redis.log(redis.LOG_WARNING, '[dueq] ' .. key .. ' is not a hash (written by something ' ..
      'other than dueq): its statistics are not kept until it is deleted')
  end
end

-- HINCRBY that reports (instead of raising) a value it cannot increment: not an integer, or
-- an increment past 2^63. Returns the new value, or nil for such a value; nil, true when the
-- key is not a hash.
local function try_incr(key, field, n)
  local r = redis.pcall('HINCRBY', key, field, n)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'not an integer', 1, true) or string.find(r.err, 'overflow', 1, true) then
      return nil
    end
    if string.find(r.err, 'WRONGTYPE', 1, true) then return nil, true end
    return redis.call('HINCRBY', key, field, n)  -- any other error: raise it as Redis said it
  end
  return r
end

-- HSET of one statistics field (a stats key that is not a hash is left alone).
local function stat_set(k_stats, field, value)
  local r = redis.pcall('HSET', k_stats, field, value)
  if type(r) == 'table' and r.err then
    if not string.find(r.err, 'WRONGTYPE', 1, true) then
      redis.call('HSET', k_stats, field, value)
    end
    stats_key_unusable(k_stats)
  end
end
