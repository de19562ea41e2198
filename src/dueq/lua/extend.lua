-- extend.lua: move the deadlines of held leases to now + the given length, in one call
-- (the lease keeper extends every lease it holds on a queue at once).
--
-- KEYS[1] leased   ZSET id -> lease deadline ms
-- KEYS[2] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[3] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] new lease length ms, counted from now
-- ARGV[3] the (id, lease token) pairs, packed back to back as struct '>Hc0Hc0'
-- Returns {new deadline ms, n, cancelled_id1, ..., cancelled_idn, lost_id1, ...}: ids not
-- extended, first the n whose task was cancelled while leased, then those whose lease was
-- lost (expired, taken over, or the task is gone); each pair is judged on its own token

local now = dueq_now(ARGV[1])
local deadline = now + tonumber(ARGV[2])
local ids, tokens = {}, {}
for id, token in pairs_unpack(ARGV[3]) do
  ids[#ids + 1] = id
  tokens[#tokens + 1] = token
end
local held, lost_ids, lost_tokens = split_held(KEYS[1], KEYS[2], ids, tokens, now)
if #held > 0 then zadd_all(KEYS[1], deadline, held) end
local cancelled, lost = split_cancelled(KEYS[3], lost_ids, lost_tokens)
return held_reply(deadline, cancelled, lost)
