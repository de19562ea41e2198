-- ack.lua: finish leased tasks; each id must still be leased under the given token.
--
-- KEYS[1] leased   ZSET id -> lease deadline ms
-- KEYS[2] tasks    HASH id -> envelope
-- KEYS[3] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[4] errors   HASH id -> JSON list of error records
-- KEYS[5] stats    HASH counter -> int
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2..] pairs: id, lease token (a repeated pair counts once)
-- Returns {acked, lost_id1, lost_id2, ...}: lost ids were not acked (lease expired or taken over)

local now = dueq_now(ARGV[1])
local ids, tokens, seen = {}, {}, {}
for i = 2, #ARGV, 2 do
  local pair = ARGV[i] .. '|' .. ARGV[i + 1]
  if not seen[pair] then
    seen[pair] = true
    ids[#ids + 1] = ARGV[i]
    tokens[#tokens + 1] = ARGV[i + 1]
  end
end
if #ids == 0 then return {0} end

local deadlines = redis.call('ZMSCORE', KEYS[1], unpack(ids))
local metas = redis.call('HMGET', KEYS[3], unpack(ids))
local done, out = {}, {0}
for i, id in ipairs(ids) do
  local _, token = meta_parse(metas[i])
  if deadlines[i] and tonumber(deadlines[i]) > now and token ~= '' and token == tokens[i] then
    done[#done + 1] = id
  else
    out[#out + 1] = id
  end
end
if #done > 0 then
  call_chunked('ZREM', KEYS[1], done)
  call_chunked('HDEL', KEYS[2], done)
  call_chunked('HDEL', KEYS[3], done)
  call_chunked('HDEL', KEYS[4], done)
  redis.call('HINCRBY', KEYS[5], 'acked', #done)
end
out[1] = #done
return out
