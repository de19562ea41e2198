-- list_tasks.lua: one page of the tasks in one state, with filters, resuming at a cursor.
-- Cost: O(log N + budget) per call, whatever the filters and the queue's size: at most
-- `budget` entries are looked at (each costs an HGET or three), and at most `limit` returned.
-- A page may hold fewer than `limit` tasks (even none) while the cursor is not done, as with
-- SCAN: the caller goes on until the cursor comes back "".
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] dead     ZSET id -> died-at ms
-- KEYS[4] tasks    HASH id -> envelope
-- KEYS[5] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[6] errors   HASH id -> JSON list of error records
-- KEYS[7] parked   ZSET due tasks whose key was at a limit (see include/key_state.lua)
-- KEYS[8] results  HASH id -> finished record (keep_results; see include/results.lua)
-- KEYS[9] finished ZSET id -> finished ms (the records of results)
-- KEYS[10] waiting ZSET id -> due ms: tasks waiting for parents (after=)
-- KEYS[11] claims  ZSET one record per claim (include/claims.lua: a first lease's meta value)
-- KEYS[12..20] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" (unused; kept for the common ARGV layout)
-- ARGV[2] state: "scheduled", "leased", "dead", "done", "cancelled", "expired" (these three:
--         the records kept by keep_results) or "waiting" (ordered by due time)
-- ARGV[3] cursor: "" to start, else the cursor a previous call returned
-- ARGV[4] limit: most tasks returned (1..1000)
-- ARGV[5] budget: most entries looked at (>= limit, <= 10000)
-- ARGV[6] id prefix ("" for any)
-- ARGV[7] text the stored payload JSON must contain ("" for any; compared byte for byte)
-- ARGV[8] error type the last error record must have ("" for any)
-- ARGV[9] lowest time kept, ms ("" for none) and ARGV[10] highest time kept, ms ("" for none):
--         the time each state is ordered by (scheduled: due; leased: lease deadline; dead:
--         died at; done, cancelled: finished at)
-- Returns {cursor ("" when done), looked at, then 6-tuples as inspect.lua: id, state, score,
--          envelope, meta, errors}; a kept record has its header JSON as meta (as inspect.lua)
-- Order: scheduled tasks by priority (9 first), then due time, then the parked ones (by key);
-- leased by lease deadline; dead by died-at, newest first; done and cancelled by finished-at,
-- newest first; dead by died-at, newest first (ties by id, descending: the order
-- of inspect.lua's dead pages, so q.dead.list and every listing agree). A cursor names the
-- source and the last entry looked at ("<source>|<score>|<member>"), so tasks that come and
-- go between calls never make a page repeat or skip the tasks that stayed.
-- @include claims
-- @include clock
-- @include errors
-- @include levels
-- @include parked

local state, cursor = ARGV[2], ARGV[3]
local limit, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local prefix, grep, error_type = ARGV[6], ARGV[7], ARGV[8]
local low, high = tonumber(ARGV[9]), tonumber(ARGV[10])
local levels = due_levels(KEYS[1])

-- Sources in listing order: a name and its ZSET (the parked set is read by member, "p").
local sources = {}
if state == 'scheduled' then
  for p = 9, 0, -1 do sources[#sources + 1] = {tostring(p), levels[p]} end
  sources[#sources + 1] = {'p', KEYS[7]}
elseif state == 'leased' then
  sources[1] = {'l', KEYS[2]}
elseif state == 'done' or state == 'cancelled' or state == 'expired' then
  sources[1] = {'f', KEYS[9]}
elseif state == 'waiting' then
  sources[1] = {'w', KEYS[10]}
else
  sources[1] = {'d', KEYS[3]}
end

local c_source, c_score, c_member = string.match(cursor, '^([^|]+)|([^|]*)|(.*)$')
local start = 1
if c_source then
  for i, s in ipairs(sources) do
    if s[1] == c_source then start = i end
  end
end

-- The entries of a scored source after (score, member), in order, at most `count`:
-- {member, score, ...}. Resumes by rank when the cursor's entry is still there (O(log N)),
-- else by score, skipping the entries of the same score up to the cursor's member. `desc`:
-- the source lists from the highest score down (the dead set, newest first).
local function scored_after(key, score, member, count, desc)
  local lo = low and ms(low) or '-inf'
  local hi = high and ms(high) or '+inf'
  local rows
  if desc then
    if member then
      local rank = redis.call('ZREVRANK', key, member)
      if rank and redis.call('ZSCORE', key, member) == score then
        return redis.call('ZREVRANGE', key, rank + 1, rank + count, 'WITHSCORES')
      end
      local got = redis.call('ZREVRANGEBYSCORE', key, score, lo, 'WITHSCORES', 'LIMIT', 0, count)
      rows = {}
      for i = 1, #got, 2 do
        if not (got[i + 1] == score and got[i] >= member) then
          rows[#rows + 1] = got[i]
          rows[#rows + 1] = got[i + 1]
        end
      end
      return rows
    end
    return redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', 0, count)
  end
  if member then
    local rank = redis.call('ZRANK', key, member)
    if rank and redis.call('ZSCORE', key, member) == score then
      rows = redis.call('ZRANGE', key, rank + 1, rank + count, 'WITHSCORES')
    else
      local got = redis.call('ZRANGEBYSCORE', key, score, hi, 'WITHSCORES', 'LIMIT', 0, count)
      rows = {}
      for i = 1, #got, 2 do
        if not (got[i + 1] == score and got[i] <= member) then
          rows[#rows + 1] = got[i]
          rows[#rows + 1] = got[i + 1]
        end
      end
    end
  else
    rows = redis.call('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', 0, count)
  end
  return rows
end

-- The last error record's type of an errors value, or nil.
local function last_error_type(raw)
  if not raw then return nil end
  local records = errors_decode(raw)
  if type(records) ~= 'table' or #records == 0 then return nil end
  local last = records[#records]
  return type(last) == 'table' and last.type or nil
end

-- The payload JSON of an envelope (after its "1:" or "2:<options>\n" head, and the trace
-- line "~<traceparent>[ <tracestate>]\n" that may follow either; envelope.py).
local function payload_text(envelope)
  local start = 3
  if string.sub(envelope, 1, 2) == '2:' then
    local newline = string.find(envelope, '\n', 1, true)
    if not newline then return envelope end
    start = newline + 1
  end
  if string.byte(envelope, start) == 126 then  -- "~": a trace line
    local newline = string.find(envelope, '\n', start, true)
    if newline then start = newline + 1 end
  end
  return string.sub(envelope, start)
end

local out = {'', 0}
local found, looked = 0, 0
-- Look at one entry; true when it is returned.
local function consider(id, score_text)
  looked = looked + 1
  if prefix ~= '' and string.sub(id, 1, #prefix) ~= prefix then return false end
  local envelope, head, errors = nil, nil, nil
  if state == 'done' or state == 'cancelled' or state == 'expired' then
    local record = redis.call('HGET', KEYS[8], id)
    if record then head, envelope = string.match(record, '^([^\n]*)\n(.*)$') end
    if not head or string.match(head, '^{"state":"(%a+)"') ~= state then return false end
  else
    envelope = redis.call('HGET', KEYS[4], id)
  end
  if not envelope then return false end  -- gone (or a dangling entry): not a task to show
  if grep ~= '' and not string.find(payload_text(envelope), grep, 1, true) then return false end
  if not head then errors = redis.call('HGET', KEYS[6], id) end
  if error_type ~= '' and last_error_type(errors) ~= error_type then return false end
  out[#out + 1] = id
  out[#out + 1] = state
  out[#out + 1] = score_text
  out[#out + 1] = envelope
  local meta = head or redis.call('HGET', KEYS[5], id)
  if not meta and state == 'leased' then meta = claims.meta(KEYS[11], score_text) end
  out[#out + 1] = meta or ''
  out[#out + 1] = errors or ''
  found = found + 1
  return true
end

local next_cursor = ''
for i = start, #sources do
  local name, key = sources[i][1], sources[i][2]
  local resume = i == start and c_source == name
  local last_member = resume and c_member ~= '' and c_member or nil
  local last_score = last_member and c_score or ''
  local exhausted = false
  while found < limit and looked < budget do
    local want = budget - looked
    if name == 'p' then
      local from = last_member and ('(' .. last_member) or '-'
      local members = redis.call('ZRANGEBYLEX', key, from, '+', 'LIMIT', 0, want)
      if #members == 0 then exhausted = true break end
      for _, member in ipairs(members) do
        last_member = member
        local zero = string.find(member, '\0', 1, true)
        local _, due_ms, id = nil, nil, nil
        if zero then _, due_ms, id = parked_parse(member, string.sub(member, 1, zero - 1)) end
        if id and (not low or due_ms >= low) and (not high or due_ms <= high) then
          consider(id, ms(due_ms))
        else
          looked = looked + 1
        end
        if found >= limit or looked >= budget then break end
      end
    else
      local desc = name == 'd' or name == 'f'
      local rows = scored_after(key, last_member and last_score, last_member, want, desc)
      if #rows == 0 then exhausted = true break end
      for j = 1, #rows, 2 do
        local at = tonumber(rows[j + 1])
        if (desc and low and at < low) or (not desc and high and at > high) then
          exhausted = true
          break
        end
        last_member, last_score = rows[j], rows[j + 1]
        consider(rows[j], rows[j + 1])
        if found >= limit or looked >= budget then break end
      end
      if exhausted then break end
    end
  end
  if not exhausted then
    next_cursor = name .. '|' .. last_score .. '|' .. (last_member or '')
    break
  end
end
out[1] = next_cursor
out[2] = looked
return out
