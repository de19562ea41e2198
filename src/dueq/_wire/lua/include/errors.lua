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

-- The decoded JSON of an error record or history, or nil when it is no JSON. A message or
-- traceback sealed by Encrypted(errors=True) is a JSON string that starts with the escape
-- \udc25 (a lone surrogate: _wire/codec.py), which cjson refuses; it is decoded without it
-- (the scripts read types and attempts, never a sealed text).
local function errors_decode(raw)
  local ok, value = pcall(cjson.decode, (string.gsub(raw, '\\udc25', '')))
  if ok then return value end
  return nil
end

-- '{"type":...}' -> '{"at":<now>,"type":...}'
local function stamp(record, now)
  return '{"at":' .. ms(now) .. ',' .. string.sub(record, 2)
end
