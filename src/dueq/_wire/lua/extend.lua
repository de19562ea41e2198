-- extend.lua: move the deadlines of held leases to now + the given length, in one call
-- (the lease keeper extends every lease it holds on a queue at once).
--
-- KEYS[1] leased   ZSET id -> lease deadline ms
-- KEYS[2] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[3] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- KEYS[4] claims   ZSET one record per claim (include/claims.lua): a first lease extended
--                  here gets the meta value it had none of, since its deadline stops naming
--                  its token
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] new lease length ms, counted from now
-- ARGV[3] the (id, lease token) pairs: each run of consecutive pairs under one token packed as
--         struct '>Hc0I4' (the token, the run's count), then '>Hc0' per id
-- Returns {new deadline ms, verdicts}: verdicts has one character per pair as given, 'h'
-- (held: extended), 'c' (its task was cancelled while leased) or 'l' (lease lost: expired,
-- taken over, or the task is gone); each pair is judged on its own token
-- @include bulk
-- @include claims
-- @include clock
-- @include lease_pairs

local now = dueq_now(ARGV[1])
local deadline = now + tonumber(ARGV[2])
local ids, tokens, positions = leases_unpack(ARGV[3])
local held, verdicts = judge_leases(KEYS[1], KEYS[2], KEYS[3], ids, tokens, now)
if #held > 0 then
  local metas = redis.call('HMGET', KEYS[2], unpack(held))
  local firsts = {}
  for i = 1, #held do if not metas[i] then firsts[#firsts + 1] = held[i] end end
  if #firsts > 0 then
    local deadlines = redis.call('ZMSCORE', KEYS[1], unpack(firsts))
    local values = {}
    for i = 1, #firsts do
      values[#values + 1] = firsts[i]
      values[#values + 1] = claims.meta(KEYS[4], deadlines[i])
    end
    hset_many(KEYS[2], values)
  end
  zadd_all(KEYS[1], deadline, held)
end
return {deadline, verdict_string(verdicts, positions)}
