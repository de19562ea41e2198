-- step_log.lua (include): reading a durable task's step log (issue 39).
--
-- The log (field <id> of the steps HASH) has one record per line: a letter, then a JSON
-- object written by dueq._wire.protocol's step owner with the tail this script adds. 'D' is a
-- committed step ({"i": position, "n": name, "a": runs, "t0": first started ms, "r": result,
-- "t1": committed ms}); only the last line may be open: 'F' a step whose body failed ("e": the
-- error), 'W' a wait for a signal ("d": its deadline ms). Records are never rewritten once
-- committed: a commit replaces only an open last line.

-- How many steps `log` has committed, the open last line (or nil), and the log without it.
local function step_log_scan(log)
  if not log or log == '' then return 0, nil, '' end
  local lines, last_start, pos = 1, 1, 1
  while true do
    local nl = string.find(log, '\n', pos, true)
    if not nl then break end
    lines, last_start, pos = lines + 1, nl + 1, nl + 1
  end
  if string.sub(log, last_start, last_start) == 'D' then return lines, nil, log end
  return lines - 1, string.sub(log, last_start), string.sub(log, 1, math.max(last_start - 2, 0))
end

-- `kept` (a log without its open line) with `line` appended.
local function step_log_add(kept, line)
  if kept == '' then return line end
  return kept .. '\n' .. line
end
