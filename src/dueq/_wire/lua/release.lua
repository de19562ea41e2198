-- release.lua: give leased tasks back without counting their deliveries as attempts, in one
-- call (a Delivery's release is a batch of one; a consumer gives back at once the tasks it
-- held unstarted for a key that a KeyCooldown holds).
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[4] stats    HASH counter -> int
-- KEYS[5] wake     Pub/Sub channel (also told when a lease ends at the concurrency cap)
-- KEYS[6] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- KEYS[7] tasks    HASH id -> envelope (read for the task's priority)
-- KEYS[8] key_state HASH per-key counts (see include/key_state.lua)
-- KEYS[9] key_wait ZSET key -> ms when its parked tasks may be claimable again
-- KEYS[10] config   HASH setting -> value (concurrency: see include/settings.lua)
-- KEYS[11] claims  ZSET one record per claim (include/claims.lua: a first lease's meta value)
-- KEYS[12..20] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] delay ms before they are due again
-- ARGV[3] key hold ms (a KeyCooldown): each task's limit key is held that long, so its other
--         tasks wait (parked); "" or 0 for none
-- ARGV[4] the (id, lease token) pairs, packed as extend.lua's
--         (leases_unpack in include/lease_pairs.lua)
-- Returns {due ms (now + delay), verdicts}: verdicts has one character per pair as given, 'h'
-- (held: released), 'c' (its task was cancelled while leased) or 'l' (lease lost); only the
-- held ones are released
-- @include claims
-- @include clock
-- @include give_back
-- @include lease_pairs

local now = dueq_now(ARGV[1])
local due = now + tonumber(ARGV[2])
local hold_ms = tonumber(ARGV[3] or '') or 0
local ids, tokens, positions = leases_unpack(ARGV[4])
local held, verdicts = judge_leases(KEYS[2], KEYS[3], KEYS[6], ids, tokens, now)
local verdict = verdict_string(verdicts, positions, #held)
if #held == 0 then return {due, verdict} end
give_back({due = KEYS[1], leased = KEYS[2], meta = KEYS[3], stats = KEYS[4], wake = KEYS[5],
  tasks = KEYS[7], key_state = KEYS[8], key_wait = KEYS[9], config = KEYS[10], claims = KEYS[11]},
  held, due,
  hold_ms, now)
return {due, verdict}
