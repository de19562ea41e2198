-- chunked.lua (include): variadic commands in chunks (Lua's unpack has a stack limit).

-- Call a variadic command in chunks (Lua's unpack has a stack limit).
local function call_chunked(cmd, key, args)
  local step = 4000
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
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
