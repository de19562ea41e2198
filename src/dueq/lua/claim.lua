-- claim.lua: return expired leases to due (or dead), then lease due tasks to one consumer.
-- Cost: O(log N + expired + limit).
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] tasks    HASH id -> envelope
-- KEYS[4] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[5] errors   HASH id -> JSON list of error records
-- KEYS[6] dead     ZSET id -> died-at ms
-- KEYS[7] stats    HASH counter -> int (field lease_seq issues lease tokens)
-- KEYS[8] config   HASH setting -> value (paused, rate)
-- KEYS[9] rate     ZSET claim -> claimed-at ms: the claims of the last rate window
-- KEYS[10..18] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] limit: most due tasks to lease (0 only reclaims)
-- ARGV[3] lease length ms
-- ARGV[4] max_attempts: an expired lease on this attempt sends the task to dead (a task's own
--         max_attempts, kept in its envelope, wins)
-- ARGV[5] most expired leases handled in this call
-- ARGV[6] dead-letter cap: most entries kept
-- ARGV[7] dead-letter cap: oldest age kept, ms
-- ARGV[8..] backoff ms after attempt 1, 2, ... for expired leases (the last entry repeats)
-- Returns {now, next_due ms or -1, next_lease_deadline ms or -1, token, lease_deadline,
--          now_us (microseconds past now, so a consumer can sleep to the due time exactly),
--          dropped (due ids without stored data, removed), buried (due tasks sent to dead here:
--          unreadable meta, or as many attempts as max_attempts already made),
--          paused (1 when the queue is paused: nothing is leased and next_due is -1, so
--          consumers sleep until resume wakes them; expired leases are still reclaimed),
--          id1, envelope1, attempt1, due1, first_claimed1, id2, envelope2, ...}
-- Due tasks are leased by priority (9 first), then earliest due within a priority.
-- With a rate "n/per_ms" set, at most n tasks are leased in any window of per_ms (counted by
-- the claim times kept in KEYS[9]); when the rate holds tasks back, next_due is when the
-- oldest claim of the window leaves it, so consumers sleep exactly until then.

local now, now_us = dueq_now_us(ARGV[1])
local limit = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local max_attempts = tonumber(ARGV[4])
local reclaim_limit = tonumber(ARGV[5])
local backoff = {}
for i = 8, #ARGV do backoff[#backoff + 1] = tonumber(ARGV[i]) end
local levels = due_levels(KEYS[1])

-- The next lease token. A lease_seq that is not a counter (corrupted) restarts above any count
-- of claims (the clock in microseconds), so a token is never issued twice.
local function next_token()
  local seq = try_incr(KEYS[7], 'lease_seq', 1)
  if seq then return ms(seq) end
  redis.log(redis.LOG_WARNING, '[dueq] lease_seq of ' .. KEYS[7] .. ' was unreadable; restarted')
  local fresh = ms(now) .. string.format('%03d', now_us)
  redis.call('HSET', KEYS[7], 'lease_seq', fresh)
  return fresh
end

-- Send a task to dead with one error record (it is not leased when this is called).
local died = 0
local function bury(id, attempt, kind, message)
  redis.call('HSET', KEYS[4], id, attempt .. '|||')
  error_append(KEYS[5], id, cjson.encode({at = now, attempt = attempt, type = kind,
    message = message}))
  redis.call('ZADD', KEYS[6], now, id)
  died = died + 1
end

-- 1. Expired leases: the holder died or hung. That delivery counts as a failed attempt.
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, reclaim_limit)
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[2], id)
  local envelope = redis.call('HGET', KEYS[3], id)
  if envelope then
    local priority, own_attempts = task_options(envelope)
    local attempt, _, _, first, readable = meta_parse(redis.call('HGET', KEYS[4], id))
    if not readable then
      bury(id, 0, 'CorruptTask', 'its attempt record was unreadable when its lease expired')
    else
      redis.call('HSET', KEYS[4], id, attempt .. '|||' .. first)
      error_append(KEYS[5], id, '{"at":' .. ms(now) .. ',"attempt":' .. attempt ..
        ',"type":"LeaseExpired","message":"lease expired before ack or fail: ' ..
        'the worker died, hung or outlived its lease","traceback":null}')
      if attempt >= (own_attempts or max_attempts) then
        redis.call('ZADD', KEYS[6], now, id)
        died = died + 1
      else
        local wait = backoff[math.min(math.max(attempt, 1), #backoff)] or 0
        redis.call('ZADD', levels[priority], now + wait, id)
      end
    end
  else
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
  end
end
if #expired > 0 then stat_incr(KEYS[7], 'expired', #expired) end

-- 2. Lease up to `limit` due tasks, earliest first.
local config = settings_read(KEYS[8], 'paused', 'rate')
local paused = config.paused == '1'
local out = {now, -1, -1, '', now + lease_ms, now_us, 0, 0, paused and 1 or 0}

-- The rate: how many more claims the window allows (nil: no rate, or an unreadable one).
local rate_n, rate_per = nil, nil
if config.rate then
  local n, per = string.match(config.rate, '^(%d+)/(%d+)$')
  rate_n, rate_per = tonumber(n), tonumber(per)
  if not (rate_n and rate_per and rate_n >= 1 and rate_per >= 1) then
    redis.log(redis.LOG_WARNING, '[dueq] rate of ' .. KEYS[8] .. ' is unreadable: ' ..
      string.sub(config.rate, 1, 40) .. '; claiming without a rate')
    rate_n, rate_per = nil, nil
  end
end
local rate_left = nil
if rate_n then
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', '(' .. ms(now - rate_per + 1))
  rate_left = math.max(rate_n - redis.call('ZCARD', KEYS[9]), 0)
  limit = math.min(limit, rate_left)
end

-- Take up to `limit` due ids, highest priority first (each level earliest first).
local ids, scores = {}, {}
if not paused then
  for p = 9, 0, -1 do
    local room = limit - #ids
    if room <= 0 then break end
    local due = redis.call('ZRANGEBYSCORE', levels[p], '-inf', now, 'WITHSCORES', 'LIMIT', 0, room)
    local got = #due / 2
    if got > 0 then
      for i = 1, got do
        ids[#ids + 1] = due[2 * i - 1]
        scores[#scores + 1] = due[2 * i]
      end
      redis.call('ZREMRANGEBYRANK', levels[p], 0, got - 1)
    end
  end
end
local n = #ids
local buried_here = 0
if n > 0 then
  local envelopes = redis.call('HMGET', KEYS[3], unpack(ids))
  local metas = redis.call('HMGET', KEYS[4], unpack(ids))
  local token = nil
  local deadline = now + lease_ms
  local leased, meta, orphans = {}, {}, {}
  for i = 1, n do
    local id, due_ms = ids[i], ms(clamp_ms(scores[i]))
    local attempt, _, _, first, readable = meta_parse(metas[i])
    local _, own_attempts = task_options(envelopes[i])
    local most = own_attempts or max_attempts
    if not envelopes[i] then
      orphans[#orphans + 1] = id  -- a due entry without data (e.g. evicted): drop it
    elseif not readable then
      bury(id, 0, 'CorruptTask', 'its attempt record was unreadable: ' ..
        string.sub(tostring(metas[i]), 1, 100))
      buried_here = buried_here + 1
    elseif attempt >= most then
      bury(id, attempt, 'AttemptsExhausted', attempt .. ' attempt(s) made; max_attempts is ' ..
        most .. ' (lowered since it was scheduled)')
      buried_here = buried_here + 1
    else
      token = token or next_token()
      attempt = attempt + 1
      if first == '' then first = ms(now) end
      leased[#leased + 1] = deadline
      leased[#leased + 1] = id
      meta[#meta + 1] = id
      meta[#meta + 1] = attempt .. '|' .. token .. '|' .. due_ms .. '|' .. first
      out[#out + 1] = id
      out[#out + 1] = envelopes[i]
      out[#out + 1] = attempt
      out[#out + 1] = due_ms
      out[#out + 1] = first
    end
  end
  if #leased > 0 then
    out[4] = token
    call_chunked('ZADD', KEYS[2], leased)
    call_chunked('HSET', KEYS[4], meta)
    stat_incr(KEYS[7], 'claimed', #leased / 2)
    if rate_n then  -- one entry per lease, unique by token and position
      local claims = {}
      for i = 1, #leased / 2 do
        claims[#claims + 1] = now
        claims[#claims + 1] = token .. ':' .. i
      end
      call_chunked('ZADD', KEYS[9], claims)
      rate_left = rate_left - #leased / 2
      redis.call('PEXPIRE', KEYS[9], rate_per + 1000)
    end
  end
  for _, id in ipairs(orphans) do redis.call('HDEL', KEYS[4], id); redis.call('HDEL', KEYS[5], id) end
  if #orphans > 0 then
    stat_incr(KEYS[7], 'dropped', #orphans)
    redis.log(redis.LOG_WARNING, '[dueq] ' .. #orphans .. ' due id(s) of ' .. KEYS[1] ..
      ' had no stored task (evicted or deleted by hand) and were dropped')
  end
  out[7] = #orphans
end
if died > 0 then
  stat_incr(KEYS[7], 'dead', died)
  trim_dead(KEYS[6], KEYS[3], KEYS[4], KEYS[5], now, tonumber(ARGV[6]), tonumber(ARGV[7]))
end
out[8] = buried_here

local next_due = levels_head(levels)
local next_deadline = head_score(KEYS[2])
if next_due and not paused then
  out[2] = clamp_ms(next_due)
  if rate_left == 0 and next_due <= now then
    -- held back by the rate: the next claim can lease when the window's oldest claim leaves
    local oldest = redis.call('ZRANGE', KEYS[9], 0, 0, 'WITHSCORES')
    if oldest[2] then out[2] = math.max(out[2], tonumber(oldest[2]) + rate_per) end
  end
end
if next_deadline then out[3] = clamp_ms(next_deadline) end
return out
