-- _prelude.lua: helpers prepended to every dueq script by scripts.py (not a script itself).
-- ARGV[1] of every script is the queue clock: epoch ms, or "" for the server's TIME.
-- meta values are "attempt|token|due_ms|first_ms": deliveries so far, the live lease token (""
-- when not leased), the due time the current delivery was claimed at, and when the task was
-- first claimed (the start of its retry history, as tenacity counts it); a lease counted
-- against its limit key's leased count has "|<key>" after them (see the per-key notes: only
-- leases of a key with a limit are counted).

-- The queue clock in epoch ms, and the microseconds past that ms (0 for an injected clock).
local function dueq_now_us(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg), 0 end
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(us / 1000), us % 1000
end

local function dueq_now(arg)
  local now = dueq_now_us(arg)
  return now
end

local function ms(n) return string.format('%d', n) end

-- Every script checks what it reads before its first write: Redis has no rollback, so a
-- script that fails half way keeps its earlier writes. Values that cannot be read are repaired
-- or reported (never an error), so corrupted data costs at most the one task it belongs to.

-- Most attempts a meta value may count; a larger number is corrupted data.
local MAX_ATTEMPT = 1000000000

-- A meta value as attempt, token, due ms, first-claim ms, whether it was readable (a missing
-- value is readable: the task was never claimed), and the limit key of a leased task with one
-- (claim.lua appends "|<key>" to the meta of such a lease, so ending it needs no envelope).
local function meta_parse(v)
  if not v then return 0, '', '', '', true, nil end
  -- `rest` is where the part after first_ms starts (a position: no string is made for it)
  local a, t, d, f, rest = string.match(v, '^(%d+)|([^|]*)|(%d*)|(%d*)()')
  local attempt = tonumber(a)
  if not attempt or attempt > MAX_ATTEMPT or #d > 16 or #f > 16 then
    return 0, '', '', '', false, nil
  end
  local key = nil
  if rest <= #v then  -- "|<key>", the key not empty
    if rest == #v or string.byte(v, rest) ~= 124 then return 0, '', '', '', false, nil end
    key = string.sub(v, rest + 1)
  end
  return attempt, t, d, f, true, key
end

-- The key whose leased count the lease of `id` is counted in (its meta's "|<key>"), or nil:
-- the key every lease end releases (a lease of a key without limits was never counted).
local function lease_key(k_meta, id)
  return select(6, meta_parse(redis.call('HGET', k_meta, id)))
end


-- Statistics (the stats hash's counters other than lease_seq, the per-minute history) are
-- never worth stopping a script for: a statistics key that holds another type than a hash
-- (written by something other than dueq) is left alone, logged once per script call, and its
-- numbers are not kept until an operator deletes it. Every other key is essential: a wrong
-- type there raises WRONGTYPE, which dueq's script runner (scripts.py) names as CorruptQueue.
local unusable_logged = {}
local function stats_key_unusable(key)
  if unusable_logged[key] then return end
  unusable_logged[key] = true
  redis.log(redis.LOG_WARNING, '[dueq] ' .. key .. ' is not a hash (written by something ' ..
    'other than dueq): its statistics are not kept until it is deleted')
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

-- History: per-minute counts of the counters in HISTORY_COUNTERS, kept for HISTORY_MINUTES in
-- one HASH (keys.py `history`): field "<minute>|<counter>" -> count, where minute is the queue
-- clock in whole minutes since the epoch, and field "last" -> the latest minute written. A
-- script that counts one of these counters calls history_use(its history key, ARGV[1]) first;
-- stat_incr then adds to the minute's bucket too. Cost per script call that counts: one HGET of
-- "last" and one HINCRBY per counter; once a minute the minutes leaving the window are deleted
-- (HDEL of 6 fields per minute passed, at most a day's worth: bounded). A clock that went back
-- writes into its (older) minute while that is still in the window.
local HISTORY_COUNTERS = {scheduled = true, claimed = true, acked = true, retried = true,
  dead = true, expired = true}
local HISTORY_NAMES = {'scheduled', 'claimed', 'acked', 'retried', 'dead', 'expired'}
local HISTORY_MINUTES = 1440
local history = nil

local function history_use(k_history, now_arg)
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
local function stat_incr(k_stats, field, n)
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

-- HSET of one statistics field (a stats key that is not a hash is left alone).
local function stat_set(k_stats, field, value)
  local r = redis.pcall('HSET', k_stats, field, value)
  if type(r) == 'table' and r.err then
    if not string.find(r.err, 'WRONGTYPE', 1, true) then redis.call('HSET', k_stats, field, value) end
    stats_key_unusable(k_stats)
  end
end

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

-- A score read back from a sorted set as whole epoch ms within 0 .. year 9999 (corrupted
-- scores such as 1.5, -1e20 or -inf are clamped, so the value can be formatted and parsed).
local MAX_MS = 253402300799999
local function clamp_ms(score)
  local n = tonumber(score)
  if not n or n ~= n or n < 0 then return 0 end
  if n > MAX_MS then return MAX_MS end
  return math.floor(n)
end

-- Keep attempt and first-claim time, drop the lease: the task is no longer leased.
local function meta_unlease(k_meta, id, attempt_delta)
  local a, _, _, f = meta_parse(redis.call('HGET', k_meta, id))
  a = math.max(a + attempt_delta, 0)
  redis.call('HSET', k_meta, id, a .. '|||' .. f)
  return a
end

-- Whether the queue holds at least `cap` live leases (deadline after now). ack, fail and
-- release ask before they end a lease, and wake consumers when it does: a consumer whose claim
-- found the queue at its concurrency cap sleeps until then (see claim.lua).
local function at_cap(k_leased, cap, now)
  return redis.call('ZCARD', k_leased) - redis.call('ZCOUNT', k_leased, '-inf', now) >= cap
end

-- A lease is held when the token matches and its deadline is still in the future.
local function lease_held(k_leased, k_meta, id, token, now)
  local deadline = redis.call('ZSCORE', k_leased, id)
  if not deadline or tonumber(deadline) <= now then return false end
  local _, t = meta_parse(redis.call('HGET', k_meta, id))
  return t ~= '' and t == token
end

-- Settings: the queue's config hash (configure.lua writes it). Every script reads and checks
-- its settings before its first write. Accepted values (dueq._wire.snapshot.setting_value is the same
-- rule in Python, with the bounds in dueq.model; tests/test_config_validation.py feeds both the
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
--   key_limits        0..SETTING_MAX_KEY_LIMITS: how many key_limit:<key> settings there are,
--                     kept by configure.lua; claim.lua reads key_limit:<key> only when > 0
-- Numbers are ASCII digits only, at most 15 of them (exact as Lua numbers). Any other value
-- is refused: the script runs as if the setting were unset, and Redis logs the refused value
-- once (the stats field "rejected:<field>" remembers the last one logged; configure.lua drops
-- it when the setting is changed).
local SETTING_MAX_RATE_N = 1000000
local SETTING_MAX_PER_MS = 31622400000  -- 366 days
local SETTING_MAX_KEY_CONCURRENCY = 1000000
local SETTING_MAX_WINDOW_MS = 31622400000  -- 366 days
local SETTING_MAX_CONCURRENCY = 1000000
local SETTING_MAX_KEY_LIMITS = 1000  -- most key_limit:<key> settings (configure.lua)
local SETTING_SHOWN = 100  -- bytes of a refused value logged and remembered

local function setting_whole(s, low, high)
  if not s or #s > 15 or not string.match(s, '^%d+$') then return nil end
  local n = tonumber(s)
  if n < low or n > high then return nil end
  return n
end

-- A setting's value as the scripts use it (paused: a boolean; a rate: {n, per_ms}; else a
-- number), and whether it was accepted. A field without a rule is passed through.
local function setting_parse(field, raw)
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
        n, per = setting_whole(n, 1, SETTING_MAX_RATE_N), setting_whole(per, 1, SETTING_MAX_PER_MS)
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
local function setting_refused(k_config, k_stats, field, raw)
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
local function settings_read(k_config, k_stats, ...)
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
-- caller's (Queue(remember_done=...), deprecated).
local function done_window(k_config, k_stats, caller_ms)
  local v = settings_read(k_config, k_stats, 'remember_done_ms').remember_done_ms
  if v ~= nil then return v end
  return tonumber(caller_ms)
end

-- The leases given as (id, lease token) pairs (ack, extend), packed as runs of consecutive
-- pairs under one token: the token ('>Hc0') and the run's count ('>I4'), then its ids ('>Hc0'
-- each). A repeated pair counts once. Returns the distinct ids and tokens, and for each pair as
-- given the index of its distinct pair (so a reply can say something about every pair, in the
-- caller's order). Pairs are told apart by id, and by "id|token" only for an id sent under two
-- tokens. A run's ids are read LEASE_IDS_STEP at a time with one struct.unpack (a call per id
-- costs more than the rest of the loop).
local leases_unpack
do  -- a block: its locals do not count against a script chunk's 200
  local LEASE_IDS_STEP = 200
  local lease_ids_formats = {}  -- count -> '>' .. count times 'Hc0'
  function leases_unpack(blob)
    local ids, tokens, by_id, by_pair, positions = {}, {}, {}, nil, {}
    local n, k, pos, size, unpack_struct = 0, 0, 1, #blob, struct.unpack
    local got = {}
    while pos <= size do
      local token, count
      token, count, pos = unpack_struct('>Hc0I4', blob, pos)
      while count > 0 do
        local step = math.min(count, LEASE_IDS_STEP)
        local format = lease_ids_formats[step]
        if not format then
          format = '>' .. string.rep('Hc0', step)
          lease_ids_formats[step] = format
        end
        got = {unpack_struct(format, blob, pos)}
        pos = got[step + 1]
        count = count - step
        for g = 1, step do
          local id = got[g]
          local at = by_id[id]
          if at == nil then
            n = n + 1
            ids[n], tokens[n], by_id[id], at = id, token, n, n
          elseif tokens[at] ~= token then
            by_pair = by_pair or {}
            local pair = id .. '|' .. token
            at = by_pair[pair]
            if not at then
              n = n + 1
              ids[n], tokens[n], by_pair[pair], at = id, token, n, n
            end
          end
          k = k + 1
          positions[k] = at
        end
      end
    end
    return ids, tokens, positions
  end
end

-- Judge each distinct lease: 'h' held under its token at now, 'c' revoked by cancel.lua
-- (cancelled while leased: remembered in k_cancelled as "id|token"), 'l' lost (expired, taken
-- over, or the task is gone). One ZMSCORE and one HMGET for the lot (callers send <= 1000).
-- Returns the held ids and the verdict of each distinct lease.
local function judge_leases(k_leased, k_meta, k_cancelled, ids, tokens, now)
  local held, verdicts, keys = {}, {}, {}
  if #ids == 0 then return held, verdicts, keys end
  -- When the earliest deadline in leased is after now, every lease is live, and a meta value
  -- whose token matches is a lease (only claim.lua writes a token into meta; whatever ends a
  -- lease clears the token or deletes the value): no deadline needs reading. Otherwise each
  -- one is read (ZMSCORE, whose reply formats a score per id: most of a lease check's cost).
  local deadlines = nil
  local earliest = redis.call('ZRANGE', k_leased, 0, 0, 'WITHSCORES')[2]
  if not earliest or tonumber(earliest) <= now then
    deadlines = redis.call('ZMSCORE', k_leased, unpack(ids))
  end
  local metas = redis.call('HMGET', k_meta, unpack(ids))
  -- whether a deadline (its text) is after now, read once per distinct text: the leases of
  -- one claim share their deadline, and tonumber's strtod costs more than the rest of a check
  local live = {}
  local n_held, match = 0, string.match
  -- the last meta value read and its token and key: the first deliveries of one claim that
  -- share a due ms share one meta value (claim.lua makes it once), and an ack lists them next
  -- to each other, so their value is parsed once (the pattern match is about 4k Redis
  -- instructions; the comparison of two Lua strings, interned, is one of pointers)
  local last_v, last_token, last_key = nil, '', nil
  for i = 1, #ids do  -- not ipairs: its iterator is a C call per id
    local id, v = ids[i], metas[i]
    -- the token and key of its meta value, as meta_parse reads them ('' and nil when it is
    -- unreadable), inlined (a Lua call per id cost more than the rest of its check) and
    -- without making strings of the parts a lease check does not need. The attempt is read
    -- as a number (strtod: about 800 instructions) only when it has ten digits or more: nine
    -- always fit MAX_ATTEMPT.
    local token, key = '', nil
    if v and v == last_v then
      token, key = last_token, last_key
    elseif v then
      local a_end, t, d, d_end, f, rest = match(v, '^%d+()|([^|]*)|()%d*()|()%d*()')
      if a_end and d_end - d <= 16 and rest - f <= 16
          and (a_end <= 10 or tonumber(string.sub(v, 1, a_end - 1)) <= MAX_ATTEMPT) then
        if rest > #v then
          token = t
        elseif rest < #v and string.byte(v, rest) == 124 then  -- "|<key>", the key not empty
          token, key = t, string.sub(v, rest + 1)
        end
      end
      last_v, last_token, last_key = v, token, key
    end
    local deadline, after = deadlines and deadlines[i], deadlines == nil
    if deadline then
      after = live[deadline]
      if after == nil then
        after = tonumber(deadline) > now
        live[deadline] = after
      end
    end
    if after and token ~= '' and token == tokens[i] then
      n_held = n_held + 1
      held[n_held] = id
      if key then keys[#keys + 1] = key end
      verdicts[i] = 'h'
    elseif redis.call('ZSCORE', k_cancelled, id .. '|' .. tokens[i]) then
      verdicts[i] = 'c'
    else
      verdicts[i] = 'l'
    end
  end
  return held, verdicts, keys
end

-- The verdict on one lease, as judge_leases gives it: 'h' held, 'c' cancelled, 'l' lost.
local function lease_verdict(k_leased, k_meta, k_cancelled, id, token, now)
  if lease_held(k_leased, k_meta, id, token, now) then return 'h' end
  if redis.call('ZSCORE', k_cancelled, id .. '|' .. token) then return 'c' end
  return 'l'
end

-- One character per pair as given: its lease's verdict ('h', 'c' or 'l'). `n_held` is the
-- number of distinct leases held: when all are, every pair's verdict is 'h'.
local function verdict_string(verdicts, positions, n_held)
  if n_held and n_held == #verdicts then return string.rep('h', #positions) end
  local out = {}
  for k, at in ipairs(positions) do out[k] = verdicts[at] end
  return table.concat(out)
end

-- Append one error record (a JSON object) to the task's JSON list of errors.
-- A history that is not a non-empty JSON array of objects (corrupted) is kept as the message
-- of an "UnreadableHistory" record rather than appended to, so the result stays valid JSON.
local function error_append(k_errors, id, record)
  local old = redis.call('HGET', k_errors, id)
  if old and string.match(old, '^%[%s*{.*}%s*%]$') then
    redis.call('HSET', k_errors, id, string.sub(old, 1, -2) .. ',' .. record .. ']')
  elseif old then
    local kept = cjson.encode({type = 'UnreadableHistory', attempt = 0,
      message = 'earlier error history was unreadable: ' .. string.sub(old, 1, 200)})
    redis.call('HSET', k_errors, id, '[' .. kept .. ',' .. record .. ']')
  else
    redis.call('HSET', k_errors, id, '[' .. record .. ']')
  end
end

-- '{"type":...}' -> '{"at":<now>,"type":...}'
local function stamp(record, now)
  return '{"at":' .. ms(now) .. ',' .. string.sub(record, 2)
end

local function forget(k_tasks, k_meta, k_errors, id)
  redis.call('HDEL', k_tasks, id)
  redis.call('HDEL', k_meta, id)
  redis.call('HDEL', k_errors, id)
end

local function head_score(k_zset)
  local head = redis.call('ZRANGE', k_zset, 0, 0, 'WITHSCORES')
  if head[2] then return tonumber(head[2]) end
  return nil
end

-- Priorities. A scheduled task waits in the due ZSET of its priority: level 0 is the queue's
-- due key, levels 1 to 9 come as the last nine KEYS of every script that touches scheduled
-- tasks (keys.py upper_due). A task's priority is kept in its envelope's version-2 head
-- "2:<priority>|<timeout ms>|<max attempts>|<key>\n" (envelope.py); version 1 means none.
local function due_levels(k_due0)
  local t = {[0] = k_due0}
  for p = 1, 9 do t[p] = KEYS[#KEYS - 9 + p] end
  return t
end

-- Priority, max attempts (or nil) and limit key (or nil) of a stored envelope; a missing or
-- unreadable head counts as none (priority 0), so corrupted options never stop a claim. A
-- version-3 head ("3:<priority>|<timeout ms>|<max attempts>|<expires ms>|<key>\n", a task
-- with an expiry: see the expiry notes) holds the same options.
local function task_options(envelope)
  if envelope and string.sub(envelope, 1, 2) == '2:' then
    local p, _, m, key = string.match(envelope, '^2:(%d)|(%d*)|(%d*)|([^\n]*)\n')
    if p then
      local attempts = tonumber(m)
      if attempts and attempts < 1 then attempts = nil end
      return tonumber(p), attempts, key ~= '' and key or nil
    end
  elseif envelope and string.sub(envelope, 1, 2) == '3:' then
    local p, _, m, key = string.match(envelope, '^3:(%d)|(%d*)|(%d*)|%d*|([^\n]*)\n')
    if p then
      local attempts = tonumber(m)
      if attempts and attempts < 1 then attempts = nil end
      return tonumber(p), attempts, key ~= '' and key or nil
    end
  end
  return 0, nil, nil
end

-- The limit key of a stored envelope, or nil (task_options' third value, found faster).
local function task_key(envelope)
  local b = envelope and string.byte(envelope, 1)
  if b == 50 then
    local key = string.match(envelope, '^2:%d|%d*|%d*|([^\n]*)\n')
    if key and key ~= '' then return key end
  elseif b == 51 then
    local key = string.match(envelope, '^3:%d|%d*|%d*|%d*|([^\n]*)\n')
    if key and key ~= '' then return key end
  end
  return nil
end

-- The due ZSET a stored envelope's task waits in.
local function level_key(levels, envelope)
  local p = task_options(envelope)
  return levels[p]
end

-- Whether any due ZSET of priorities 1 to 9 holds tasks (one call, so that a queue without
-- priorities pays one command, not nine, where a script looks at every level).
local function upper_levels_used(levels)
  return redis.call('EXISTS', unpack(levels, 1, 9)) > 0
end

-- The earliest score over every priority level (only level 0 when `base_only`), or nil when
-- all are empty. Without `base_only`, one EXISTS tells whether the upper levels need reading
-- (a queue without priorities pays two commands, not ten).
local function levels_head(levels, base_only)
  if base_only == nil then base_only = not upper_levels_used(levels) end
  local best = nil
  for p = 0, base_only and 0 or 9 do
    local h = head_score(levels[p])
    if h and (not best or h < best) then best = h end
  end
  return best
end

-- Publish a message on the queue's wake channel. SPUBLISH (sharded Pub/Sub, Redis >= 7.0)
-- keeps it on the nodes that serve the channel's slot, where a Cluster would forward a plain
-- PUBLISH to every node. A server without SPUBLISH (6.2), or an ACL user without +spublish,
-- publishes the classic way; the listeners (dueq._consume.wake) subscribe the same way by server version.
local function publish_wake(k_wake, message)
  local sent = redis.pcall('SPUBLISH', k_wake, message)
  if type(sent) == 'table' and sent.err then
    redis.call('PUBLISH', k_wake, message)
  end
end

-- Publish on the wake channel when due_ms is earlier than the head that was there before.
local function wake_if_earlier(k_wake, previous_head, due_ms)
  if previous_head == nil or due_ms < previous_head then
    publish_wake(k_wake, ms(due_ms))
  end
end

-- Results (keep_results). With the setting keep_results_ms > 0, a task that ends by ack or
-- cancel leaves a record in the results HASH (id -> '<header JSON>\n<envelope>', the header
-- {"state":"done"|"cancelled","finished_ms":..,"attempt":..,"result":<JSON or null>,
-- "unstored":"<why>" when the handler's value could not be kept, "errors":[...] the failed
-- attempts' records when there were any}) and its finished time in
-- the finished ZSET. Each script that writes a record drops the records older than the
-- retention, at most RESULTS_TRIM + written per call (and, once the setting is off, the
-- leftovers as if the retention were 0): no sweeper. Dead tasks stay in the dead set as ever.
-- The ids of tasks that ended (acked while results are kept, dead, cancelled) are published
-- on the ended channel, packed as struct '>Hc0' each, for q.wait.
local RESULTS_TRIM = 1000

local function results_keep_ms(k_config, k_stats)
  return settings_read(k_config, k_stats, 'keep_results_ms').keep_results_ms or 0
end

local function results_record(state, now, attempt, result, unstored, errors)
  local head = '{"state":"' .. state .. '","finished_ms":' .. ms(now) .. ',"attempt":' ..
    attempt .. ',"result":' .. (result or 'null')
  if unstored then head = head .. ',"unstored":' .. cjson.encode(unstored) end
  if errors then  -- the error history as stored, when it is a JSON list (else left out)
    local ok, list = pcall(cjson.decode, errors)
    if ok and type(list) == 'table' then head = head .. ',"errors":' .. errors end
  end
  return head .. '}'
end

local function results_trim(k_results, k_finished, now, keep_ms, written)
  local upto = keep_ms > 0 and '(' .. ms(now - keep_ms) or '+inf'  -- off: drop every one
  local old = redis.call('ZRANGEBYSCORE', k_finished, '-inf', upto, 'LIMIT', 0,
    RESULTS_TRIM + written)
  if #old > 0 then
    for i = 1, #old, 1000 do
      local chunk = {unpack(old, i, math.min(i + 999, #old))}
      redis.call('HDEL', k_results, unpack(chunk))
      redis.call('ZREM', k_finished, unpack(chunk))
    end
  end
end

-- Publish the ids of tasks that ended (SPUBLISH where there is, as publish_wake does).
local function publish_ended(k_ended, ids)
  if #ids == 0 then return end
  local parts = {}
  for i, id in ipairs(ids) do parts[i] = struct.pack('>Hc0', #id, id) end
  publish_wake(k_ended, table.concat(parts))
end

-- Drop dead tasks older than max_age_ms and beyond max_count (bounded work per call).
local TRIM_BATCH = 1000
local function trim_dead(k_dead, k_tasks, k_meta, k_errors, now, max_count, max_age_ms)
  local trimmed = 0
  local old = redis.call('ZRANGEBYSCORE', k_dead, '-inf', '(' .. ms(now - max_age_ms),
    'LIMIT', 0, TRIM_BATCH)
  for _, id in ipairs(old) do
    forget(k_tasks, k_meta, k_errors, id)
    redis.call('ZREM', k_dead, id)
    trimmed = trimmed + 1
  end
  local excess = redis.call('ZCARD', k_dead) - max_count
  if excess > 0 then
    if excess > TRIM_BATCH then excess = TRIM_BATCH end
    local oldest = redis.call('ZRANGE', k_dead, 0, excess - 1)
    for _, id in ipairs(oldest) do forget(k_tasks, k_meta, k_errors, id) end
    redis.call('ZREMRANGEBYRANK', k_dead, 0, excess - 1)
    trimmed = trimmed + #oldest
  end
  return trimmed
end

-- Call a variadic command in chunks (Lua's unpack has a stack limit).
local function call_chunked(cmd, key, args)
  local step = 4000
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end

-- HSET of field, value pairs and ZADD of score, member pairs (flat lists), in chunks. Redis 7.0
-- keeps a hash or a ZSET that is new (or small) as a listpack until it holds 128 entries, and
-- each entry added to a listpack scans it: 1,000 new fields into an empty hash cost about 1 us
-- each, against 0.2 us in a hashtable, and 1,000 leases into an empty leased set 4.4k Redis
-- instructions per task (callgrind: zzlFind and lpFind; Redis 7.2 sizes a new ZSET from the
-- batch by itself). The hot keys (meta, leased, key_state, due) empty out whenever a drain
-- catches up, so each claim would pay that again. A batch of more than 128 entries therefore
-- goes in behind one extra entry named HASHTABLE_FIELD, longer than the *-max-listpack-value
-- settings (64), which makes Redis build or convert the big encoding first, and which is
-- removed right after. That name is 1,000 bytes: no task id (MAX_ID_BYTES 512), limit key
-- (MAX_KEY_BYTES 200) or parked member (a key, an id and 16 bytes) can be as long, so it never
-- stands for real data.
local HASHTABLE_FIELD = string.rep('\0', 1000)
local function add_many(cmd, k, pairs_list, helper_a, helper_b, drop)
  local n = #pairs_list
  if n <= 256 then
    if n > 0 then redis.call(cmd, k, unpack(pairs_list)) end
    return
  end
  redis.call(cmd, k, helper_a, helper_b, unpack(pairs_list, 1, math.min(n, 4000)))
  for i = 4001, n, 4000 do
    redis.call(cmd, k, unpack(pairs_list, i, math.min(i + 3999, n)))
  end
  redis.call(drop, k, HASHTABLE_FIELD)
end
local function hset_many(k_hash, pairs_list)
  add_many('HSET', k_hash, pairs_list, HASHTABLE_FIELD, '', 'HDEL')
end
local function zadd_many(k_zset, pairs_list)
  add_many('ZADD', k_zset, pairs_list, 0, HASHTABLE_FIELD, 'ZREM')
end

-- The scores (as Redis gives them) of `ids`, the first members of a ZSET in rank order. Members
-- that share a score are read as a run: ZSCORE of the run's first member, then ZCOUNT up to
-- that score says where the run ends (every member before it is in the run or an earlier one).
-- After 4 runs, the rest come with one ZMSCORE. Redis 7.0 formats every score it
-- replies with sprintf (about 3.6k instructions each); tasks scheduled together share their
-- due ms, so a claim of 1,000 of them reads one score instead of 1,000, and a claim of tasks
-- that all differ pays 8 small commands more than reading the scores with the ids.
local function run_scores(k_zset, ids)
  local out, n, i, runs = {}, #ids, 1, 0
  while i <= n and runs < 4 do
    local score = redis.call('ZSCORE', k_zset, ids[i])
    if not score then break end  -- (not reached: ids were just read from k_zset)
    local upto = math.max(math.min(redis.call('ZCOUNT', k_zset, '-inf', score), n), i)
    for j = i, upto do out[j] = score end
    i = upto + 1
    runs = runs + 1
  end
  for from = i, n, 4000 do
    local to = math.min(from + 3999, n)
    local rest = redis.call('ZMSCORE', k_zset, unpack(ids, from, to))
    for j = from, to do out[j] = rest[j - from + 1] end
  end
  return out
end

-- ZADD every id with the same score.
local function zadd_all(k_zset, score, ids)
  local args = {}
  for _, id in ipairs(ids) do
    args[#args + 1] = score
    args[#args + 1] = id
  end
  zadd_many(k_zset, args)
end

-- Add one task due at due_ms unless the id exists in any state; true if it was added.
local function add_task(k_tasks, k_due, k_stats, id, envelope, due_ms)
  if redis.call('HSETNX', k_tasks, id, envelope) == 0 then return false end
  redis.call('ZADD', k_due, due_ms, id)
  stat_incr(k_stats, 'scheduled', 1)
  return true
end

-- cron_state values are "head_ms|last_ms|head_id": the pending occurrence and the last fired
-- slot of one cron definition.
-- The last instant a slot may have: 9999-12-31T23:59:59.999Z (Python's datetime ends there).
local MAX_SLOT_MS = MAX_MS

local function ms_text_ok(s, may_be_empty)
  if s == '' then return may_be_empty end
  return #s <= 15 and string.match(s, '^%d+$') ~= nil and tonumber(s) <= MAX_SLOT_MS
end

-- head_ms, last_ms (text, last may be '') and head_id of a cron_state value, or nil when the
-- value is missing or not "<ms>|<ms or empty>|cron:<name>:<YYYYMMDDTHHMMSSZ>".
local function cron_state_read(v, name)
  if not v then return nil end
  local head, last, id = string.match(v, '^(%d+)|(%d*)|(.*)$')
  if not head or not ms_text_ok(head, false) or not ms_text_ok(last, true) then return nil end
  local prefix = 'cron:' .. name .. ':'
  if #id ~= #prefix + 16 or string.sub(id, 1, #prefix) ~= prefix
      or not string.match(string.sub(id, #prefix + 1), '^%d%d%d%d%d%d%d%dT%d%d%d%d%d%dZ$') then
    return nil
  end
  return head, last, id
end

-- Withdraw a cron definition's pending occurrence if it is still waiting in the due ZSET of
-- its priority (levels: due_levels; one already leased or retrying runs out); it counts as
-- cancelled.
local function cron_withdraw(levels, k_tasks, k_meta, k_errors, k_stats, id)
  if not id or id == '' then return end
  local envelope = redis.call('HGET', k_tasks, id)
  local k_level = envelope and level_key(levels, envelope)
  if k_level and redis.call('ZREM', k_level, id) == 1 then
    forget(k_tasks, k_meta, k_errors, id)
    stat_incr(k_stats, 'cancelled', 1)
  end
end

-- Cron runs records: the cron_runs HASH (keys.py) holds, per definition that fired (with or
-- without policies) or is finished, JSON
-- {"fired": occurrences started, "skipped": slots skipped by overlap, "finished": "limit" or
-- "end" once it fires no more, "run": id of the latest started occurrence, "buffered": id of
-- the occurrence waiting for it (overlap "buffer_one")}. Written by the cron scripts only; an
-- unreadable value reads as a new record.
local function cron_runs_read(k_runs, name)
  local ok, t = pcall(cjson.decode, redis.call('HGET', k_runs, name) or '{}')
  if not ok or type(t) ~= 'table' then t = {} end
  local r = {}
  for _, f in ipairs({'fired', 'skipped'}) do
    r[f] = type(t[f]) == 'number' and t[f] >= 0 and math.floor(t[f]) or 0
  end
  for _, f in ipairs({'finished', 'run', 'buffered'}) do
    r[f] = type(t[f]) == 'string' and t[f] or nil
  end
  return r
end

local function cron_runs_write(k_runs, name, r)
  local parts = {'"fired":' .. ms(r.fired), '"skipped":' .. ms(r.skipped)}
  for _, f in ipairs({'finished', 'run', 'buffered'}) do
    if r[f] then parts[#parts + 1] = '"' .. f .. '":' .. cjson.encode(r[f]) end
  end
  redis.call('HSET', k_runs, name, '{' .. table.concat(parts, ',') .. '}')
end

-- Cron last outcomes: the cron_last HASH (keys.py) holds, per definition name, the outcome of
-- its last firing as JSON {"id", "outcome" ("acked", "retrying" or "dead"), "at" ms,
-- "error_type" (or null), "ok_at" ms of its last ack (or null)}. Scripts that settle a
-- delivery call cron_note for ids that start with "cron:" (callers test the first byte, 99,
-- so other tasks pay one string.byte). Only the occurrence of the latest slot counts (a late
-- retry of an older one only moves ok_at), only while the definition exists (so the hash
-- holds at most one field per definition; cron_remove drops it), and an unreadable value is
-- overwritten.
local CRON_LABEL = '(%d%d%d%d%d%d%d%dT%d%d%d%d%d%dZ)'
local CRON_HEX8 = string.rep('[0-9a-f]', 8)

-- Name and slot label (UTC, so later labels sort later as text) of an occurrence id:
-- "cron:<name>:<label>" or run_now's "cron:<name>:now:<label>:<8 hex>"; nil for other ids.
local function cron_occurrence(id)
  local name, label = string.match(id, '^cron:(.+):' .. CRON_LABEL .. '$')
  if name then return name, label end
  return string.match(id, '^cron:(.+):now:' .. CRON_LABEL .. ':' .. CRON_HEX8 .. '$')
end

-- "failures" counts consecutive dead occurrences in the order they end (an ack resets it), for
-- the definition's pause_after_failures (cron_advance pauses it); "cancelled" is written by
-- cron_advance for an occurrence that overlap "cancel_other" cancelled.
local function cron_note(k_cron, k_last, id, outcome, now, error_type)
  local name, label = cron_occurrence(id)
  if not name or redis.call('HEXISTS', k_cron, name) == 0 then return end
  local ok, old = pcall(cjson.decode, redis.call('HGET', k_last, name) or 'null')
  local ok_at = outcome == 'acked' and now or nil
  local failures = 0
  if outcome ~= 'acked' and ok and type(old) == 'table' and type(old.failures) == 'number' then
    failures = math.min(math.max(math.floor(old.failures), 0), 1000000)
  end
  if outcome == 'dead' then failures = failures + 1 end
  if ok and type(old) == 'table' and type(old.id) == 'string' and type(old.at) == 'number'
      and type(old.outcome) == 'string' then
    local old_ok = type(old.ok_at) == 'number' and clamp_ms(old.ok_at) or nil
    if old_ok and (not ok_at or old_ok > ok_at) then ok_at = old_ok end
    local _, old_label = cron_occurrence(old.id)
    if old_label and old_label > label then  -- a later firing's outcome stays
      if outcome ~= 'acked' and outcome ~= 'dead' then return end
      id, outcome, now, error_type = old.id, old.outcome, clamp_ms(old.at), old.error_type
    end
  end
  if type(error_type) ~= 'string' then error_type = nil end
  redis.call('HSET', k_last, name, '{"id":' .. cjson.encode(id) .. ',"outcome":' ..
    cjson.encode(outcome) .. ',"at":' .. ms(now) .. ',"error_type":' ..
    (error_type and cjson.encode(string.sub(error_type, 1, 200)) or 'null') ..
    ',"ok_at":' .. (ok_at and ms(ok_at) or 'null') ..
    (failures > 0 and ',"failures":' .. ms(failures) or '') .. '}')
end

-- Consecutive dead occurrences of a definition (cron_note's "failures"), 0 when unknown.
local function cron_failures(k_last, name)
  local ok, t = pcall(cjson.decode, redis.call('HGET', k_last, name) or '{}')
  if ok and type(t) == 'table' and type(t.failures) == 'number' then return t.failures end
  return 0
end

-- Per-key limits. A task scheduled with key= counts against its key's limits (the queue's
-- key_concurrency and key_rate settings) while it is leased. The key-state HASH holds one value
-- per key, "leased|mark|parked": its leased tasks, the earliest ms its rate admits its next
-- claim (GCRA's theoretical arrival time, without burst: claims of one key are spaced per/n
-- apart; empty when none is pending) and how many of its tasks are parked; a key with nothing
-- to remember has no field. A due task whose key is at a limit is parked (the parked ZSET,
-- every member scored 0 so that one ZRANGEBYLEX finds a key's tasks in priority and due order)
-- instead of blocking the tasks behind it, and the key-wait ZSET (key -> ms) says when a
-- key's parked tasks may be claimable again: when its rate admits the next claim, or now when
-- one of its leases ends. A parked task keeps its due ms in its meta value (token empty), so
-- it can be found by id.
-- Only a key with a limit (key_concurrency or key_rate, or its own key_limit:<key>) has its
-- leases counted: claim.lua appends "|<key>" to the meta of each lease it counts, and every
-- lease end releases the key its meta names (lease_key), so a count is never taken back twice
-- or for a lease it never held. Keyed tasks of a queue without key limits (and without key
-- state: a KeyCooldown's mark) cost a claim and an ack nothing for their keys. A change that
-- gives a key a limit counts that key's live leases then (configure.lua).

-- A key-state value as leased, mark (0: none) and parked; an unreadable value reads as zeros.
-- Parsed once per distinct value in a script call (key_state_seen): the keys one claim leased
-- share their value ("1|<mark>|0"), so a batch of keys mostly parses one string.
local key_state_seen = {}
local function key_state_parse(v)
  if not v then return 0, 0, 0 end
  local s = key_state_seen[v]
  if not s then
    local f, t, p = string.match(v, '^(%d+)|([%d.]*)|(%d+)$')
    s = {tonumber(f) or 0, tonumber(t) or 0, tonumber(p) or 0}
    key_state_seen[v] = s
  end
  return s[1], s[2], s[3]
end

-- The value to store for a key's state at `now`, or nil when there is nothing to remember.
-- Built once per distinct (mark, leased, parked) in a script call (key_state_texts), for the
-- same reason.
local key_state_texts = {}
local function key_state_value(leased, mark, parked, now)
  local keep_mark = mark > now
  if leased <= 0 and parked <= 0 and not keep_mark then return nil end
  if leased < 0 then leased = 0 end
  if parked < 0 then parked = 0 end
  if not keep_mark then mark = 0 end
  local by_mark = key_state_texts[mark]
  if not by_mark then
    by_mark = {text = keep_mark and string.format('%.3f', mark) or ''}
    key_state_texts[mark] = by_mark
  end
  local by_leased = by_mark[leased]
  if not by_leased then
    by_leased = {}
    by_mark[leased] = by_leased
  end
  local v = by_leased[parked]
  if not v then
    v = leased .. '|' .. by_mark.text .. '|' .. parked
    by_leased[parked] = v
  end
  return v
end

-- Write key states: `values` maps key -> value or false (delete); one HSET and one HDEL.
local function key_state_write(k_state, values)
  local set, drop = {}, {}
  for key, v in pairs(values) do
    if v then
      set[#set + 1] = key
      set[#set + 1] = v
    else
      drop[#drop + 1] = key
    end
  end
  if #set > 0 then hset_many(k_state, set) end
  if #drop > 0 then call_chunked('HDEL', k_state, drop) end
end

local function parked_member(key, priority, due_ms, id)
  return key .. '\0' .. (9 - priority) .. string.format('%015d', due_ms) .. id
end

-- The priority, due ms and id of a parked member of `key`, or nil when it cannot be read.
local function parked_parse(member, key)
  local rest = string.sub(member, #key + 2)
  local inverted, due, id = string.match(rest, '^(%d)(%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(.+)$')
  if not inverted then return nil end
  return 9 - tonumber(inverted), tonumber(due), id
end

-- The parked member of a task with `key` whose meta value holds its due ms, or nil.
local function parked_member_of(k_meta, key, priority, id)
  local _, token, due = meta_parse(redis.call('HGET', k_meta, id))
  if token ~= '' or due == '' then return nil end
  return parked_member(key, priority, tonumber(due), id)
end

-- HMGET of any number of fields (Lua's unpack has a stack limit).
local function hmget_chunked(key, fields)
  if #fields <= 4000 then return redis.call('HMGET', key, unpack(fields)) end
  local out = {}
  for i = 1, #fields, 4000 do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + 3999, #fields)))
    for _, v in ipairs(part) do out[#out + 1] = v end
  end
  return out
end

-- ZADD with an option (LT, XX, ...) of score, member pairs, in chunks.
local function zadd_chunked(k_zset, option, pairs_list)
  for i = 1, #pairs_list, 4000 do
    redis.call('ZADD', k_zset, option, unpack(pairs_list, i, math.min(i + 3999, #pairs_list)))
  end
end

-- Leases of these keys ended (`keys` names a key once per lease: acked, failed, released,
-- expired, cancelled or replaced): their leased counts drop, rate marks that lie in the past
-- are dropped, and keys with parked tasks are made ready for the next claim. One HMGET, HSET,
-- HDEL and ZADD for any number of keys. True when consumers should be woken.
local function keys_release(k_state, k_wait, keys, now)
  local ended, order, n = {}, {}, 0
  for i = 1, #keys do
    local key = keys[i]
    local c = ended[key]
    if c then
      ended[key] = c + 1
    else
      ended[key] = 1
      n = n + 1
      order[n] = key
    end
  end
  if n == 0 then return false end
  local values = hmget_chunked(k_state, order)
  local set, drop, ready, n_set, n_drop, n_ready = {}, {}, {}, 0, 0, 0
  -- the last value read and its parts: the keys one claim leased share one value
  local seen, leased, mark, parked = nil, 0, 0, 0
  for i = 1, n do
    local key, value = order[i], values[i]
    if value ~= seen then
      leased, mark, parked = key_state_parse(value)
      seen = value
    end
    local left = leased - ended[key]
    -- nothing left to remember (key_state_value's nil, tested inline: the common case)
    local v = not (left <= 0 and parked <= 0 and mark <= now)
      and key_state_value(left, mark, parked, now)
    if v then
      set[n_set + 1], set[n_set + 2] = key, v
      n_set = n_set + 2
    else
      n_drop = n_drop + 1
      drop[n_drop] = key
    end
    if parked > 0 then
      ready[n_ready + 1], ready[n_ready + 2] = now, key
      n_ready = n_ready + 2
    end
  end
  if n_set > 0 then hset_many(k_state, set) end
  if n_drop > 0 then call_chunked('HDEL', k_state, drop) end
  if n_ready > 0 then zadd_chunked(k_wait, 'LT', ready) end
  return n_ready > 0
end

-- Hold a key until `until_ms` (a handler's KeyCooldown, release.lua): its rate mark moves there
-- (claim.lua parks the key's due tasks while its mark lies ahead, whatever its limits), and its
-- parked tasks wait until then.
local function key_hold(k_state, k_wait, key, until_ms, now)
  local leased, mark, parked = key_state_parse(redis.call('HGET', k_state, key))
  if until_ms > mark then mark = until_ms end
  key_state_write(k_state, {[key] = key_state_value(leased, mark, parked, now) or false})
  if parked > 0 then redis.call('ZADD', k_wait, mark, key) end
end

-- keys_release for one lease of `key`.
local function key_unlease(k_state, k_wait, key, now)
  return keys_release(k_state, k_wait, {key}, now)
end

-- Take a scheduled task with `key` out of the parked set, if it is parked there; true if it was.
local function unpark_one(k_parked, k_state, k_meta, key, priority, id)
  local member = parked_member_of(k_meta, key, priority, id)
  if member and redis.call('ZREM', k_parked, member) == 1 then
    local leased, mark, parked = key_state_parse(redis.call('HGET', k_state, key))
    key_state_write(k_state, {[key] = key_state_value(leased, mark, parked - 1, 0) or false})
    return true
  end
  return false
end

-- Expiry (issue 29). A task scheduled with expires= carries its expiry, epoch ms, in a
-- version-3 envelope head (task_options); tasks without one keep their version-1 or 2 form.
-- schedule.lua turns a relative expiry (record flag 8: ms from now) into epoch ms on the queue
-- clock. claim.lua never leases a task past its expiry: it ends it "expired" (tasks_expire);
-- fail.lua ends a task whose next attempt would come at or after its expiry the same way, and
-- so does claim.lua for a lease that ran out (its retry judged as a failure's).
-- The counter is expired_tasks ("expired" counts leases that ran out).

-- The expiry of a stored envelope, epoch ms, or nil.
local function task_expires(envelope)
  if envelope and string.byte(envelope, 1) == 51 then
    return tonumber(string.match(envelope, '^3:%d|%d*|%d*|(%d+)|'))
  end
  return nil
end

-- Whether a stored envelope's expiry is at or before `at` ms (false: none, or unreadable).
local function task_expired(envelope, at)
  local expires = task_expires(envelope)
  return expires ~= nil and expires <= at
end

-- The envelope with its relative expiry (ms from now) made absolute.
local function expiry_absolute(envelope, now)
  local _, e, rel = string.find(envelope, '^3:%d|%d*|%d*|(%d+)|')
  if not e then return envelope end
  return string.sub(envelope, 1, e - #rel - 1) .. ms(now + tonumber(rel)) ..
    string.sub(envelope, e)
end

-- Debounce (issue 29). The debounce HASH (keys.py) holds, per debounced id, "<cap ms>" (the
-- latest due time repeated schedules may move it to: the first schedule + max_wait; empty
-- for no bound), and while the task runs (leased, or waiting for a retry of a run) the one
-- follow-up that schedules made meanwhile: "<cap ms>|<due ms>|<envelope>". The follow-up
-- replaces the task when its run ends (ack, dead, expired: followups_start), due at its
-- due time or then, whichever is later. A lease is never revoked by a debounced schedule.

-- A debounced task that was just added: remember its cap; its due time (capped).
local function debounce_start(k_debounce, id, now, due, max_wait)
  if max_wait < 0 then
    redis.call('HDEL', k_debounce, id)
    return due
  end
  local cap = now + max_wait
  redis.call('HSET', k_debounce, id, ms(cap))
  return math.min(due, cap)
end

-- A debounced schedule of a task that runs: keep (or update) its one follow-up; true if so
-- (false: the task does not run and has no follow-up, so the caller replaces it in place).
local function debounce_follow(k_debounce, k_leased, id, envelope, now, due, max_wait)
  local entry = redis.call('HGET', k_debounce, id)
  local cap, pending = nil, false
  if entry then
    local c, fdue = string.match(entry, '^(%d*)|(%d+)|')
    pending = fdue ~= nil
    if pending then cap = tonumber(c) end
  end
  if not pending then
    if not redis.call('ZSCORE', k_leased, id) then return false end
    if max_wait >= 0 then cap = now + max_wait end
  end
  if cap and due > cap then due = math.max(cap, now) end
  redis.call('HSET', k_debounce, id, (cap and ms(cap) or '') .. '|' .. ms(due) .. '|' .. envelope)
  return true
end

-- A debounced schedule replacing a task in place (not running): its due time, capped by the
-- cap of its first debounced schedule (or a new cap from now).
local function debounce_due(k_debounce, id, now, due, max_wait)
  local cap = tonumber(string.match(redis.call('HGET', k_debounce, id) or '', '^(%d+)$'))
  if not cap then
    if max_wait < 0 then return due end
    cap = now + max_wait
    redis.call('HSET', k_debounce, id, ms(cap))
  end
  return math.max(math.min(due, cap), now)
end

-- The runs of `ids` ended (acked, expired, or dead): each one's follow-up, if it has one,
-- becomes the task (attempts from 0; a dead run leaves the dead set, as replace=True would
-- take it out), due at its due time or now; other entries are dropped. Counts them as
-- scheduled and tells the wake channel (k.wake may be nil) of an earlier head.
-- k: {debounce, tasks, meta, errors, stats, wake (or nil), dead (or nil)}.
local function followups_start(k, levels, ids, now)
  local k_debounce, k_tasks, k_meta, k_errors, k_dead = k.debounce, k.tasks, k.meta, k.errors,
    k.dead
  if #ids == 0 or redis.call('EXISTS', k_debounce) == 0 then return end
  local entries = hmget_chunked(k_debounce, ids)
  local previous_head = k.wake and levels_head(levels)
  local earliest, started = nil, 0
  for i, id in ipairs(ids) do
    local entry = entries[i]
    if entry then
      local cap, due, from = string.match(entry, '^(%d*)|(%d+)|()')
      if cap then
        local envelope = string.sub(entry, from)
        due = math.max(tonumber(due), now)
        if k_dead then redis.call('ZREM', k_dead, id) end
        redis.call('HDEL', k_meta, id)
        redis.call('HDEL', k_errors, id)
        redis.call('HSET', k_tasks, id, envelope)
        local k_level = level_key(levels, envelope)
        redis.call('ZADD', k_level, due, id)
        if cap ~= '' then redis.call('HSET', k_debounce, id, cap) end
        if cap == '' then redis.call('HDEL', k_debounce, id) end
        if not earliest or due < earliest then earliest = due end
        started = started + 1
      else
        redis.call('HDEL', k_debounce, id)
      end
    end
  end
  if started > 0 then stat_incr(k.stats, 'scheduled', started) end
  if earliest and k.wake then wake_if_earlier(k.wake, previous_head, earliest) end
end

-- End tasks that are not leased (out of their due sets already) as expired: a kept record
-- with keep_results, the counter, the ended channel, their data dropped, follow-ups started.
-- Callers note each id's "expired" outcome event (outcome_events.note, with the envelope and
-- attempt they already hold) and flush them with their other events.
-- k: {tasks, meta, errors, stats, results, finished, ended, debounce, wake (or nil)}.
local function tasks_expire(k, levels, ids, now, keep_ms)
  if #ids == 0 then return end
  local k_tasks, k_meta, k_errors, k_results, k_finished = k.tasks, k.meta, k.errors, k.results,
    k.finished
  if keep_ms > 0 then
    local envelopes = hmget_chunked(k_tasks, ids)
    local metas = hmget_chunked(k_meta, ids)
    local errors = hmget_chunked(k_errors, ids)
    local records = {}
    for i, id in ipairs(ids) do
      records[#records + 1] = id
      records[#records + 1] = results_record('expired', now, meta_parse(metas[i]), nil, nil,
        errors[i] or nil) .. '\n' .. (envelopes[i] or '')
    end
    call_chunked('HSET', k_results, records)
    zadd_all(k_finished, now, ids)
  end
  results_trim(k_results, k_finished, now, keep_ms, #ids)
  call_chunked('HDEL', k_tasks, ids)
  call_chunked('HDEL', k_meta, ids)
  call_chunked('HDEL', k_errors, ids)
  stat_incr(k.stats, 'expired_tasks', #ids)
  publish_ended(k.ended, ids)
  followups_start(k, levels, ids, now)
end

-- Cron occurrences with an expiry (issue 29: cron.add(..., expires=)). The definition's
-- envelope carries the expiry as ms after the slot, in a version-3 head; each occurrence is
-- stored with it made absolute from its own nominal slot (before jitter; cron_expiring). The
-- pending occurrence is stored without it (version 2, cron_pending), so claim.lua always hands
-- it to the keeper and the schedule moves on: cron_advance writes its expiry into it when it
-- is claimed (and ends it expired then if it is late). Envelopes of other heads pass unchanged.

-- Epoch ms of the slot an occurrence id names ("cron:<name>:<label>", run_now's asked second).
local function cron_slot_ms(id)
  local _, label = cron_occurrence(id)
  local y, mo, d, h, mi, s = string.match(label or '',
    '^(%d%d%d%d)(%d%d)(%d%d)T(%d%d)(%d%d)(%d%d)Z$')
  if not y then return nil end
  y, mo = tonumber(y), tonumber(mo)
  if mo <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((mo + 9) % 12) + 2) / 5) + tonumber(d) - 1
  local days = era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
    - 719468
  return (((days * 24 + tonumber(h)) * 60 + tonumber(mi)) * 60 + tonumber(s)) * 1000
end

-- A definition's envelope as one occurrence stores it: its relative expiry counted from
-- `base` ms (nil: the slot its id names; an id naming none counts from 0, so expired).
local function cron_expiring(envelope, id, base)
  if string.byte(envelope, 1) ~= 51 then return envelope end
  return expiry_absolute(envelope, base or cron_slot_ms(id) or 0)
end

-- A definition's envelope as its pending occurrence stores it: without the expiry.
local function cron_pending(envelope)
  if string.byte(envelope, 1) ~= 51 then return envelope end
  local _, e, expiry_at = string.find(envelope, '^3:%d|%d*|%d*|()%d+|')
  if not e then return envelope end
  return '2:' .. string.sub(envelope, 3, expiry_at - 1) .. string.sub(envelope, e + 1)
end

-- Outcome events (issue 30). With the setting events_ms > 0, each script that settles a task
-- appends one entry per outcome to the queue's events STREAM (keys.py `events`): fields "id"
-- (the task id), "kind" (acked, retried, dead, cancelled, expired), "attempt", "at" (ms), and
-- when there is one "task" (the stored envelope), "result" (the kept JSON value, acked with
-- keep_results) and "error" (the error record, retried and dead). Entry ids follow the queue
-- clock ("<now>-*"; "*" for server TIME, and when an injected clock went back behind the
-- stream's last id). Each write trims entries older than events_ms (XADD MINID ~) and keeps
-- the stream near MAX_LEN entries (XTRIM MAXLEN ~ when XLEN passes it). Scripts note
-- outcomes as they go (outcome_events.note: a Lua table, nothing in Redis) and write them at
-- the end with outcome_events.flush, which writes nothing when events are off (events_ms
-- unset or 0).
-- (The helpers live in one table, outcome_events: a chunk has at most 200 locals.)
local outcome_events = {MAX_LEN = 1000000, noted = {}}

function outcome_events.note(kind, id, attempt, envelope, result, err)
  local noted = outcome_events.noted
  noted[#noted + 1] = {kind, id, attempt, envelope, result, err}
end

-- outcome_events.note for each acked id (in `done`), with its envelope and attempt from the task's hash
-- and meta (read only when events are on: callers ask), and its kept result when `results`
-- (id -> JSON) has one.
function outcome_events.note_acked(k_tasks, k_meta, done, results)
  if #done == 0 then return end
  local envelopes = hmget_chunked(k_tasks, done)
  local metas = hmget_chunked(k_meta, done)
  for i, id in ipairs(done) do
    outcome_events.note('acked', id, (meta_parse(metas[i] or nil)), envelopes[i] or nil,
      results and results[id] or nil)
  end
end

function outcome_events.flush(k_events, events_ms, now, clock_arg)
  if not events_ms or events_ms <= 0 or #outcome_events.noted == 0 then
    outcome_events.noted = {}
    return
  end
  local minid = ms(math.max(now - events_ms, 0))
  for _, e in ipairs(outcome_events.noted) do
    local fields = {'id', e[2], 'kind', e[1], 'attempt', e[3] or 0, 'at', ms(now)}
    if e[4] then fields[#fields + 1] = 'task'; fields[#fields + 1] = e[4] end
    if e[5] then fields[#fields + 1] = 'result'; fields[#fields + 1] = e[5] end
    if e[6] then fields[#fields + 1] = 'error'; fields[#fields + 1] = e[6] end
    local done = false
    if clock_arg ~= '' then
      local r = redis.pcall('XADD', k_events, 'MINID', '~', minid, ms(now) .. '-*',
        unpack(fields))
      done = not (type(r) == 'table' and r.err)
    end
    if not done then redis.call('XADD', k_events, 'MINID', '~', minid, '*', unpack(fields)) end
  end
  outcome_events.noted = {}
  if redis.call('XLEN', k_events) > outcome_events.MAX_LEN then
    redis.call('XTRIM', k_events, 'MAXLEN', '~', outcome_events.MAX_LEN)
  end
end

-- Batches (docs/batches.md). The batches HASH keeps one record per batch:
-- "total|acked|dead|cancelled|expired|created_ms|closed_ms|completed_ms" (closed_ms and
-- completed_ms empty until then), then "|1" when its completion task was not scheduled
-- because a task with its id existed when the batch completed (close_batch.lua refuses an id
-- taken when it closes; one scheduled after the close is found here). schedule.lua makes a task a member when it adds it (an id
-- that already existed is never counted twice) and keeps id -> batch in batch:of, so a task
-- without a batch costs nothing. The scripts that end a task (ack, fail and claim to dead,
-- cancel, expiry) call batch_settle: it removes the id from batch:of and counts the outcome.
-- Once the batch is closed (close_batch.lua) and nothing is pending, the script that sees it
-- (the one settling the last member, or close_batch.lua) schedules the completion task kept in
-- batch:on, exactly once (the field is deleted as it is scheduled; completed_ms is set). A
-- completed batch's record is kept BATCH_KEEP_MS, then dropped by the next script that
-- completes a batch (at most BATCH_TRIM per call); a batch never closed is kept until it is.
local links = {}  -- the batch and dependency helpers (one local: a chunk has at most 200)
links.BATCH_KEEP_MS = 7 * 86400000
links.BATCH_TRIM = 100
links.BATCH_OUTCOMES = {acked = 2, dead = 3, cancelled = 4, expired = 5}

-- A batch record as a list {total, acked, dead, cancelled, expired, created, closed|false,
-- completed|false, completion taken (1)|nil}, or nil when there is none (unreadable counts
-- read as 0).
function links.batch_parse(v)
  if not v then return nil end
  local b, i = {}, 0
  for part in string.gmatch(v .. '|', '([^|]*)|') do
    i = i + 1
    b[i] = tonumber(part) or (i <= 6 and 0 or false)
  end
  for j = i + 1, 8 do b[j] = j <= 6 and 0 or false end
  return b
end

function links.batch_text(b)
  return table.concat({ms(b[1]), ms(b[2]), ms(b[3]), ms(b[4]), ms(b[5]), ms(b[6]),
    b[7] and ms(b[7]) or '', b[8] and ms(b[8]) or ''}, '|') .. (b[9] == 1 and '|1' or '')
end

-- The keys batch_settle and batch_finish use (levels: due_levels of the script's KEYS).
function links.batch_keys(k_batches, k_of, k_on, k_ended, levels, k_tasks, k_stats, k_wake)
  return {batches = k_batches, of = k_of, on = k_on, ended = k_ended, levels = levels,
    tasks = k_tasks, stats = k_stats, wake = k_wake}
end

-- When batch record b is closed and has no member pending, schedule its completion task (a
-- schedule.lua record, '>BdHc0I4c0') unless its id exists (then b notes it, and Redis's log
-- says so), and mark b completed (b changes; the caller writes it). Completed batches older than BATCH_KEEP_MS are dropped here.
function links.batch_finish(bk, batch, b, now)
  if not b[7] or b[8] or b[1] - b[2] - b[3] - b[4] - b[5] > 0 then return end
  local k_on, k_tasks, k_ended, k_batches = bk.on, bk.tasks, bk.ended, bk.batches
  b[8] = now
  local record = redis.call('HGET', k_on, batch)
  if record then
    redis.call('HDEL', k_on, batch)
    local flags, due, id, envelope = struct.unpack('>BdHc0I4c0', record)
    if flags % 2 == 0 then due = now + due elseif due < now then due = now end
    if redis.call('HSETNX', k_tasks, id, envelope) == 1 then
      local previous = levels_head(bk.levels)
      local k_level = level_key(bk.levels, envelope)
      redis.call('ZADD', k_level, due, id)
      stat_incr(bk.stats, 'scheduled', 1)
      wake_if_earlier(bk.wake, previous, due)
    else
      b[9] = 1
      redis.log(redis.LOG_WARNING, '[dueq] batch ' .. batch .. ' of ' .. k_batches ..
        ' completed, but its completion task ' .. id .. ' was not scheduled: a task with ' ..
        'that id exists')
    end
  end
  local old = redis.call('ZRANGEBYSCORE', k_ended, '-inf', '(' .. ms(now - links.BATCH_KEEP_MS),
    'LIMIT', 0, links.BATCH_TRIM)
  if #old > 0 then
    redis.call('HDEL', k_batches, unpack(old))
    redis.call('ZREM', k_ended, unpack(old))
  end
  redis.call('ZADD', k_ended, now, batch)
end

-- Count the end of tasks `ids` (outcome: acked, dead, cancelled or expired) in their batches,
-- and complete the batches that this leaves closed with nothing pending. One HMGET of
-- batch:of when none of the ids is a member.
function links.batch_settle(bk, ids, outcome, now)
  if #ids == 0 then return end
  local k_of, k_batches = bk.of, bk.batches
  if redis.call('EXISTS', k_of) == 0 then return end  -- no open batch has a member
  local of = hmget_chunked(k_of, ids)
  local members, touched, order = {}, {}, {}
  local slot = links.BATCH_OUTCOMES[outcome]
  for i, id in ipairs(ids) do
    local batch = of[i]
    if batch then
      members[#members + 1] = id
      local b = touched[batch]
      if b == nil then
        b = links.batch_parse(redis.call('HGET', k_batches, batch)) or false
        touched[batch] = b
        if b then order[#order + 1] = batch end
      end
      if b then b[slot] = b[slot] + 1 end
    end
  end
  if #members == 0 then return end
  call_chunked('HDEL', k_of, members)
  for _, batch in ipairs(order) do
    local b = touched[batch]
    links.batch_finish(bk, batch, b, now)
    redis.call('HSET', k_batches, batch, links.batch_text(b))
  end
end

-- schedule.lua's side: whether `batch` still takes members (it has not completed), with the
-- batch records read once per call in `cache`.
function links.batch_takes(k_batches, cache, batch, now)
  local b = cache[batch]
  if b == nil then
    b = links.batch_parse(redis.call('HGET', k_batches, batch)) or {0, 0, 0, 0, 0, now, false, false}
    cache[batch] = b
  end
  return not b[8]
end

-- Write the members schedule.lua added (`joined`: id, batch, id, batch, ...) and their
-- batches' new totals.
function links.batch_join(k_batches, k_of, cache, joined)
  if #joined == 0 then return end
  local counted = {}
  for i = 2, #joined, 2 do
    local batch = joined[i]
    counted[batch] = (counted[batch] or 0) + 1
  end
  call_chunked('HSET', k_of, joined)
  for batch, n in pairs(counted) do
    local b = cache[batch]
    b[1] = b[1] + n
    redis.call('HSET', k_batches, batch, links.batch_text(b))
  end
end

-- Dependencies (docs/dependencies.md). A task scheduled with parents (a schedule.lua record
-- with flag 32) that are not all finished waits in the waiting ZSET (id -> its due ms), out of
-- every due set, with after: id -> "<parents not finished>|<policy>|<parents waited for,
-- joined by "\0">" (policy "f": a parent that ends dead, cancelled or expired ends it dead;
-- "r": it runs anyway), and one member "<parent>\0<child>" per edge in the children ZSET (all
-- scores 0, so one ZRANGEBYLEX finds a parent's children). The scripts that end a task call
-- after_settle: an acked parent counts down its children and releases those with none left
-- into their due set; a parent that ended otherwise sends its "f" children to dead (and their
-- children, in turn). No polling.

-- A record's parents ('>I4' count, then '>Hc0' each) from pos: the list and the next pos.
function links.after_unpack(blob, pos)
  local n
  n, pos = struct.unpack('>I4', blob, pos)
  local parents = {}
  for i = 1, n do parents[i], pos = struct.unpack('>Hc0', blob, pos) end
  return parents, pos
end

-- The position after a schedule record's trailers (max wait, batch, parents), given its flags
-- and the position after its envelope (spark_stage.lua stages whole records).
function links.record_end(blob, pos, flags)
  local _
  if flags % 8 >= 4 then pos = pos + 8 end
  if flags % 32 >= 16 then _, pos = struct.unpack('>Hc0', blob, pos) end
  if flags % 64 >= 32 then _, pos = links.after_unpack(blob, pos) end
  return pos
end

function links.after_keys(k_waiting, k_after, k_children, k_dead, k_errors, k_ended, bk)
  return {waiting = k_waiting, after = k_after, children = k_children, dead = k_dead,
    errors = k_errors, ended = k_ended, bk = bk}
end

-- How a parent stands when its child is scheduled: 'open' (in the queue, not dead: the child
-- waits), 'ok' (acked: kept as done by keep_results, or gone: nothing of it is left, which is
-- all an acked task leaves without keep_results) or 'failed' with how it ended.
function links.after_parent(ak, k_results, parent)
  local bk = ak.bk
  local k_tasks, k_dead = bk.tasks, ak.dead
  if redis.call('HEXISTS', k_tasks, parent) == 1 then
    if redis.call('ZSCORE', k_dead, parent) then return 'failed', 'dead' end
    return 'open'
  end
  local record = redis.call('HGET', k_results, parent)
  local state = record and string.match(record, '^{"state":"(%a+)"')
  if state and state ~= 'done' then return 'failed', state end
  return 'ok'
end

-- A task stops waiting: out of the waiting set, its after entry and its edges under the
-- parents it still waits for (listed in the entry) dropped.
function links.after_drop(ak, id)
  local k_waiting, k_after, k_children = ak.waiting, ak.after, ak.children
  local v = redis.call('HGET', k_after, id)
  if not v then return end
  local edges = {}
  for parent in string.gmatch(string.match(v, '^%d+|%a|(.*)$') or '', '([^%z]+)') do
    edges[#edges + 1] = parent .. '\0' .. id
  end
  if #edges > 0 then call_chunked('ZREM', k_children, edges) end
  redis.call('HDEL', k_after, id)
  redis.call('ZREM', k_waiting, id)
end

-- Send a waiting child to dead because a parent ended `how`; returns nothing (the caller
-- collects the id).
function links.after_bury(ak, child, parent, how, now)
  local k_dead = ak.dead
  links.after_drop(ak, child)
  redis.call('ZADD', k_dead, now, child)
  local record = cjson.encode({at = now, attempt = 0, type = 'ParentFailed',
    message = 'parent ' .. parent .. ' ended ' .. how})
  error_append(ak.errors, child, record)
  stat_incr(ak.bk.stats, 'dead', 1)
  local k_tasks = ak.bk.tasks  -- an outcome event, written by the script's outcome_events.flush
  outcome_events.note('dead', child, 0, redis.call('HGET', k_tasks, child) or nil, nil, record)
end

-- schedule.lua: a task just added (id) with parents; returns 'run' (put it in its due set as
-- usual), 'wait' (it waits: written here) or 'dead' (a parent had failed, policy "f":
-- buried here).
function links.after_join(ak, k_results, id, parents, policy, due, now)
  local k_children, k_after, k_waiting = ak.children, ak.after, ak.waiting
  local open = {}
  for _, parent in ipairs(parents) do
    local stands, how = links.after_parent(ak, k_results, parent)
    if stands == 'open' and parent ~= id then
      open[#open + 1] = parent
    elseif stands == 'failed' and policy == 'f' then
      links.after_bury(ak, id, parent, how, now)
      return 'dead'
    end
  end
  if #open == 0 then return 'run' end
  for _, parent in ipairs(open) do redis.call('ZADD', k_children, 0, parent .. '\0' .. id) end
  redis.call('HSET', k_after, id, #open .. '|' .. policy .. '|' .. table.concat(open, '\0'))
  redis.call('ZADD', k_waiting, due, id)
  return 'wait'
end

-- The scripts that end tasks: `ids` ended, acked when `ok`, else `how` (dead, cancelled,
-- expired). Releases or buries their waiting children (and the children of those buried, in
-- turn); returns the ids buried here (the caller counts them in their batches).
function links.after_settle(ak, ids, ok, how, now)
  local k_children, k_after, k_waiting = ak.children, ak.after, ak.waiting
  local bk = ak.bk
  local buried, released = {}, 0
  if #ids == 0 or redis.call('EXISTS', k_children) == 0 then return buried end  -- no waiting
  local previous_head = nil
  local todo, i = {}, 1
  for _, id in ipairs(ids) do todo[#todo + 1] = {id, ok, how} end
  while todo[i] do
    local parent, parent_ok, parent_how = todo[i][1], todo[i][2], todo[i][3]
    i = i + 1
    local edges = redis.call('ZRANGEBYLEX', k_children, '[' .. parent .. '\0',
      '[' .. parent .. '\1')
    if #edges > 0 then call_chunked('ZREM', k_children, edges) end
    for _, edge in ipairs(edges) do
      local child = string.sub(edge, #parent + 2)
      local v = redis.call('HGET', k_after, child)
      local n, policy, rest = string.match(v or '', '^(%d+)|(%a)(.*)$')
      n = tonumber(n)
      if n and (parent_ok or policy == 'r') then
        if n > 1 then
          redis.call('HSET', k_after, child, (n - 1) .. '|' .. policy .. rest)
        else
          local due = tonumber(redis.call('ZSCORE', k_waiting, child)) or now
          if due < now then due = now end
          redis.call('ZREM', k_waiting, child)
          redis.call('HDEL', k_after, child)
          local k_tasks = bk.tasks
          local envelope = redis.call('HGET', k_tasks, child)
          if envelope then
            if released == 0 then previous_head = levels_head(bk.levels) end
            local k_level = level_key(bk.levels, envelope)
            redis.call('ZADD', k_level, due, child)
            released = released + 1
            wake_if_earlier(bk.wake, previous_head, due)
          end
        end
      elseif n then
        links.after_bury(ak, child, parent, parent_how, now)
        buried[#buried + 1] = child
        todo[#todo + 1] = {child, false, 'dead'}
      end
    end
  end
  if ak.ended then publish_ended(ak.ended, buried) end
  return buried
end

-- The most dependency edges after_cycle follows for one record (docs/dependencies.md).
links.CYCLE_WALK = 2000  -- 7 to 25 us an edge (HGET + ZSCORE): 15 to 50 ms at the bound

-- The parents a waiting task still waits for: the ids listed in its after entry whose edge to
-- it stands (an acked parent's edge is gone while the list keeps its id).
function links.after_parents_of(ak, id)
  local k_after, k_children = ak.after, ak.children
  local v = redis.call('HGET', k_after, id)
  local parents = {}
  for parent in string.gmatch(string.match(v or '', '^%d+|%a|(.*)$') or '', '([^%z]+)') do
    if redis.call('ZSCORE', k_children, parent .. '\0' .. id) then
      parents[#parents + 1] = parent
    end
  end
  return parents
end

-- schedule.lua, before a task is written with `parents`: whether that would close a cycle,
-- that is whether a parent waits, through waiting tasks, for `id` (so `id` must already have
-- waiting children: only a replaced task can). Returns false, 'cycle', or 'unchecked' when
-- more than links.CYCLE_WALK edges lie on the way (the record is refused then too). Walks the
-- after entries upward from the parents, each task once.
function links.after_cycle(ak, id, parents)
  local k_children = ak.children
  if #redis.call('ZRANGEBYLEX', k_children, '[' .. id .. '\0', '[' .. id .. '\1', 'LIMIT', 0,
    1) == 0 then
    return false
  end
  local seen, todo, walked = {}, {}, 0
  for _, parent in ipairs(parents) do
    if parent ~= id then todo[#todo + 1] = parent end  -- a task that names itself skips it
  end
  while #todo > 0 do
    local node = table.remove(todo)
    if node == id then return 'cycle' end
    if not seen[node] then
      seen[node] = true
      for _, parent in ipairs(links.after_parents_of(ak, node)) do
        walked = walked + 1
        if walked > links.CYCLE_WALK then return 'unchecked' end
        if not seen[parent] then todo[#todo + 1] = parent end
      end
    end
  end
  return false
end

-- cancel.lua, and schedule.lua when it replaces a task: a waiting task stops waiting.
function links.after_forget(ak, id)
  links.after_drop(ak, id)
end

-- What every script that ends tasks calls once: `ids` ended with `outcome` (acked, dead,
-- cancelled, expired). Their waiting children are released or buried (after_settle), and
-- they and any children buried are counted in their batches (batch_settle).
function links.tasks_ended(bk, ak, ids, outcome, now)
  local buried = links.after_settle(ak, ids, outcome == 'acked', outcome, now)
  links.batch_settle(bk, ids, outcome, now)
  links.batch_settle(bk, buried, 'dead', now)
end
