-- errors.lua (include): a task's error history (the errors hash).
-- @include clock

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
