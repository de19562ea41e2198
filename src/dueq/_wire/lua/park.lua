-- park.lua: end a durable task's attempt under its lease without counting it, in one call
-- (issue 39): for a sleep, a wait for a signal or a step's own retry, write the step's record
-- and hand the task back to due (no lease held: include/give_back.lua) until it is due again.
-- A wait takes a signal kept for it instead, if there is one (then the task stays leased).
--
-- KEYS[1] due      ZSET id -> due ms (level 0; the levels are the last nine KEYS)
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[4] stats    HASH counter -> int
-- KEYS[5] wake     Pub/Sub channel (a task handed back earlier than a level's head)
-- KEYS[6] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- KEYS[7] tasks    HASH id -> envelope (its priority and key)
-- KEYS[8] key_state HASH per-key counts (see include/key_state.lua)
-- KEYS[9] key_wait ZSET key -> ms when its parked tasks may be claimable again
-- KEYS[10] config  HASH setting -> value (concurrency: see include/settings.lua)
-- KEYS[11] steps   HASH the durable tasks' state (include/steps.lua, include/step_log.lua)
-- KEYS[12] claims  ZSET one record per claim (include/claims.lua: a first lease's meta value)
-- KEYS[13..21] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] task id
-- ARGV[3] lease token
-- ARGV[4] op: "fail" (a failed run of a step, handed back for its retry's delay), "sleep"
--         (commit a sleep and hand the task back until it ends), "again" (hand back a task
--         whose committed sleep has not ended; writes no record), "wait" (take a signal, or
--         time out, or hand the task back until a signal or the deadline)
-- ARGV[5] the position of the record: how many steps the caller found committed
-- ARGV[6] the record's head: its JSON object without the closing brace
-- ARGV[7] fail: the error (JSON); sleep: the delay ms; again: the
--         committed wake ms; wait: the timeout ms, "" for none (used when no wait is open
--         at this position: an open one keeps its deadline)
-- ARGV[8] fail: ms after which the task is handed back (a step's own retry); wait: the signal
--         name
-- Returns {status, value}: status 1 done, 0 lease lost, 3 cancelled while leased, 5 the log
--   does not have ARGV[5] committed steps (value: how many it has). The value of a done
--   call: fail the due ms; sleep and again the due ms
--   when handed back, -1 when the sleep is over (go on); wait "P" .. the deadline ms (handed
--   back), "=" .. the payload of the signal taken, or "~" (timed out)
-- @include claims
-- @include clock
-- @include give_back
-- @include leases
-- @include step_log

local NEVER_MS = 253402300799000  -- a wait without a timeout: 9999-12-31T23:59:59Z
local now = dueq_now(ARGV[1])
local id, op = ARGV[2], ARGV[4]
local verdict = lease_verdict(KEYS[2], KEYS[3], KEYS[6], id, ARGV[3], now)
if verdict == 'c' then return {3, ''} end
if verdict ~= 'h' then return {0, ''} end
local log = redis.call('HGET', KEYS[11], id)
local committed, open, kept = step_log_scan(log)
local position = tonumber(ARGV[5])
local k = {due = KEYS[1], leased = KEYS[2], meta = KEYS[3], stats = KEYS[4], wake = KEYS[5],
  tasks = KEYS[7], key_state = KEYS[8], key_wait = KEYS[9], config = KEYS[10], claims = KEYS[12]}
if op == 'again' then
  local wake_ms = tonumber(ARGV[7])
  if wake_ms <= now then return {1, -1} end
  give_back(k, {id}, wake_ms, 0, now)
  return {1, wake_ms}
end
if committed ~= position then
  -- this very wait again, after it took a signal or timed out (its reply was lost with a
  -- dropped connection and the client sent it once more): answer what it answered
  local last = committed == position + 1 and op == 'wait' and step_log_last(kept) or ''
  if string.sub(last, 1, #ARGV[6] + 1) == 'R' .. ARGV[6] then
    if string.find(last, ',"x":1,"t1":%d+}$') then return {1, '~'} end
    local payload = string.match(last, ',"r":(.*),"s":%d+,"t1":%d+}$')
    if payload then return {1, '=' .. payload} end
  end
  return {5, committed}
end
local head, value = ARGV[6], ARGV[7]
if op == 'fail' then
  redis.call('HSET', KEYS[11], id, step_log_add(kept, 'F' .. head .. ',"e":' .. value .. '}'))
  local due = now + tonumber(ARGV[8])
  give_back(k, {id}, due, 0, now)
  return {1, due}
elseif op == 'sleep' then
  local wake_ms = now + tonumber(value)
  redis.call('HSET', KEYS[11], id, step_log_add(kept, 'S' .. head .. ',"r":' .. ms(wake_ms) ..
    '}'))
  if wake_ms <= now then return {1, -1} end
  give_back(k, {id}, wake_ms, 0, now)
  return {1, wake_ms}
end
-- wait: the first signal of this name not yet taken, else time out, else hand back
local deadline = open and string.sub(open, 1, 1) == 'W' and tonumber(string.match(open,
  ',"d":(%d+)}$')) or (value == '' and NEVER_MS or now + tonumber(value))
local name, k_signals = ARGV[8], id .. '\0s'
local signals = redis.call('HGET', KEYS[11], k_signals)
if signals then
  local prefix, pos = name .. '\t', 1
  while pos <= #signals do
    local nl = string.find(signals, '\n', pos, true) or (#signals + 1)
    if string.sub(signals, pos, pos + #prefix - 1) == prefix then
      local sent, payload = string.match(string.sub(signals, pos + #prefix, nl - 1),
        '^(%d+)\t(.*)$')
      local rest = string.sub(signals, 1, math.max(pos - 2, 0)) ..
        (pos > 1 and nl <= #signals and '\n' or '') .. string.sub(signals, nl + 1)
      if rest == '' then redis.call('HDEL', KEYS[11], k_signals)
      else redis.call('HSET', KEYS[11], k_signals, rest) end
      redis.call('HSET', KEYS[11], id, step_log_add(kept, 'R' .. head .. ',"r":' .. payload ..
        ',"s":' .. sent .. ',"t1":' .. ms(now) .. '}'))
      return {1, '=' .. payload}
    end
    pos = nl + 1
  end
end
if deadline <= now then
  redis.call('HSET', KEYS[11], id, step_log_add(kept, 'R' .. head .. ',"r":null,"x":1,"t1":'
    .. ms(now) .. '}'))
  return {1, '~'}
end
redis.call('HSET', KEYS[11], id, step_log_add(kept, 'W' .. head .. ',"d":' .. ms(deadline) .. '}'))
give_back(k, {id}, deadline, 0, now)
return {1, 'P' .. ms(deadline)}
