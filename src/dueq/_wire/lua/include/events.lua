-- events.lua (include): outcome events (the events stream).
-- @include chunked
-- @include clock
-- @include meta

-- Outcome events (issue 30). With the setting events_ms > 0, each script that settles a task
-- appends one entry per outcome to the queue's events STREAM (keys.py `events`): fields "id"
-- (the task id), "kind" (acked, retried, dead, cancelled, expired; and progress, written by
-- progress.lua with "seq" and "body", the entry's JSON), "attempt", "at" (ms), and
-- when there is one "task" (the stored envelope), "result" (the kept JSON value, acked with
-- keep_results) and "error" (the error record, retried and dead). Entry ids follow the queue
-- clock ("<now>-*"; "*" for server TIME, and when an injected clock went back behind the
-- stream's last id). Each write trims entries older than events_ms (XADD MINID ~) and keeps
-- the stream near MAX_LEN entries (XTRIM MAXLEN ~ when XLEN passes it). Scripts note
-- outcomes as they go (outcome_events.note: a Lua table, nothing in Redis) and write them at
-- the end with outcome_events.flush, which writes nothing when events are off (events_ms
-- unset or 0).
-- (The helpers live in one table, outcome_events, beside the outcomes noted so far.)
local outcome_events = {MAX_LEN = 1000000, noted = {}}

-- `extra`: more fields of the entry, as a flat list (progress.lua's "seq" and "body").
function outcome_events.note(kind, id, attempt, envelope, result, err, extra)
  local noted = outcome_events.noted
  noted[#noted + 1] = {kind, id, attempt, envelope, result, err, extra}
end

-- outcome_events.note for each acked id (in `done`), with its envelope and attempt from the task's hash
-- and meta (read only when events are on: callers ask), and its kept result when `results`
-- (id -> JSON) has one.
function outcome_events.note_acked(k_tasks, k_meta, done, results)
  if #done == 0 then return end
  local envelopes = hmget_chunked(k_tasks, done)
  local metas = hmget_chunked(k_meta, done)
  for i, id in ipairs(done) do
    -- (a first lease has no meta value: attempt 1)
    outcome_events.note('acked', id, metas[i] and meta_parse(metas[i]) or 1, envelopes[i] or nil,
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
    if e[7] then for _, v in ipairs(e[7]) do fields[#fields + 1] = v end end
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
