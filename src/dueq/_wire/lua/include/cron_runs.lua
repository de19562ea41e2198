-- cron_runs.lua (include): cron runs records (the cron_runs hash).
-- @include clock

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
