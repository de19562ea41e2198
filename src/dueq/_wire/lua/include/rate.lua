-- rate.lua (include): the queue-wide rate's window of claims (claim.lua).
-- @include clock

-- The queue-wide rate's window (claim.lua): drop the claims of `k_rate` older than `since_ms`
-- and return how many tasks the rest leased. The sum is kept in the stats field
-- rate_in_window, so a claim costs O(log N + claims that left the window), not a walk of the
-- window; an entry "<n>*<token>" counts n, any other (an older dueq wrote one per task) 1.
-- A missing or unreadable sum, or one below one per entry, is recounted (bounded by the
-- window); a plausible sum written by hand is trusted.
local function rate_entry_count(member)
  return tonumber(string.match(member, '^(%d+)%*')) or 1
end

local function rate_window(k_rate, k_stats, since_ms)
  local cutoff = '(' .. ms(since_ms)
  local gone = redis.call('ZRANGEBYSCORE', k_rate, '-inf', cutoff)
  local left = redis.call('ZCARD', k_rate) - #gone
  if left <= 0 then
    if #gone > 0 then redis.call('DEL', k_rate) end
    return 0
  end
  local sum = redis.pcall('HGET', k_stats, 'rate_in_window')
  sum = type(sum) ~= 'table' and tonumber(sum) or nil  -- a stats key that is not a hash: recount
  if sum and sum >= 0 and math.floor(sum) == sum then
    for i = 1, #gone do sum = sum - rate_entry_count(gone[i]) end
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', k_rate, '-inf', cutoff) end
  if not (sum and sum >= left) then  -- unknown or impossible (each entry counts >= 1): recount
    sum = 0
    for _, member in ipairs(redis.call('ZRANGE', k_rate, 0, -1)) do
      sum = sum + rate_entry_count(member)
    end
  end
  return sum
end
