-- step_log.lua (include): reading a durable task's step log (issue 39).
--
-- The log (field <id> of the steps HASH) has one record per line, in the order the function
-- reached its steps: a letter, then a JSON object whose head dueq.durable._run writes (name
-- "n", runs "a" when over 1, started "t0" ms, body ms "u") and whose tail this script adds.
-- Committed: 'D' a step ("r" its result), 'S' a sleep ("r" its wake ms), 'R' a wait that took
-- a signal ("r" the payload, "s" when it was sent) or timed out ("r" null, "x" 1), with "t1"
-- when it ended. Only the last line may be open: 'F' a step whose body failed ("e" the
-- error), 'W' a wait for a signal ("d" its deadline ms). A committed record is never
-- rewritten: a write replaces only an open last line.

-- How many steps `log` has committed, the open last line (or nil), and the log without it.
local function step_log_scan(log)
  if not log or log == '' then return 0, nil, '' end
  local lines, last_start, pos = 1, 1, 1
  while true do
    local nl = string.find(log, '\n', pos, true)
    if not nl then break end
    lines, last_start, pos = lines + 1, nl + 1, nl + 1
  end
  local letter = string.sub(log, last_start, last_start)
  if letter ~= 'F' and letter ~= 'W' then return lines, nil, log end
  return lines - 1, string.sub(log, last_start), string.sub(log, 1, math.max(last_start - 2, 0))
end

-- `kept` (a log without its open line) with `line` appended.
local function step_log_add(kept, line)
  if kept == '' then return line end
  return kept .. '\n' .. line
end

-- Whether `log`'s last line is `line`.
local function step_log_ends_with(log, line)
  local n = #log - #line
  return n >= 0 and string.sub(log, n + 1) == line and (n == 0 or string.sub(log, n, n) == '\n')
end

-- The last line of `log` ('' for none).
local function step_log_last(log)
  local from = 1
  while true do
    local nl = string.find(log, '\n', from, true)
    if not nl then return string.sub(log, from) end
    from = nl + 1
  end
end
