-- ack.lua: finish leased tasks; each id must still be leased under the given token.
--
-- KEYS[1] leased   ZSET id -> lease deadline ms
-- KEYS[2] tasks    HASH id -> envelope
-- KEYS[3] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[4] errors   HASH id -> JSON list of error records
-- KEYS[5] stats    HASH counter -> int
-- KEYS[6] done     ZSET id -> acked-at ms (written only when the remember-done window > 0)
-- KEYS[7] config   HASH setting -> value (remember_done_ms)
-- KEYS[8] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] remember-done window ms when the queue's config has none (deprecated constructor
--         keyword): record acked ids in done, and drop entries older than the window (at most
--         TRIM_DONE + acked per call); 0 leaves done alone
-- ARGV[3] the (id, lease token) pairs, packed back to back as struct '>Hc0Hc0' (one
--         argument keeps a batch cheap to send; a repeated pair counts once)
-- Returns {acked, n, cancelled_id1, ..., cancelled_idn, lost_id1, ...}: ids not acked, first
--         the n whose task was cancelled while leased, then those whose lease was lost
--         (expired or taken over)

local TRIM_DONE = 1000
local now = dueq_now(ARGV[1])
local window = done_window(KEYS[7], ARGV[2])
local ids, tokens, seen = {}, {}, {}
for id, token in pairs_unpack(ARGV[3]) do
  local pair = id .. '|' .. token
  if not seen[pair] then
    seen[pair] = true
    ids[#ids + 1] = id
    tokens[#tokens + 1] = token
  end
end
if #ids == 0 then return {0} end

local done, lost_ids, lost_tokens = split_held(KEYS[1], KEYS[3], ids, tokens, now)
local cancelled, lost = split_cancelled(KEYS[8], lost_ids, lost_tokens)
if #done > 0 then
  call_chunked('ZREM', KEYS[1], done)
  call_chunked('HDEL', KEYS[2], done)
  call_chunked('HDEL', KEYS[3], done)
  call_chunked('HDEL', KEYS[4], done)
  stat_incr(KEYS[5], 'acked', #done)
  if window > 0 then zadd_all(KEYS[6], now, done) end
end
if window > 0 then
  local expired = redis.call('ZCOUNT', KEYS[6], '-inf', '(' .. ms(now - window))
  if expired > 0 then
    redis.call('ZREMRANGEBYRANK', KEYS[6], 0, math.min(expired, TRIM_DONE + #done) - 1)
  end
end
return held_reply(#done, cancelled, lost)
