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
-- KEYS[11..19] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] delay ms before they are due again
-- ARGV[3] key hold ms (a KeyCooldown): each task's limit key is held that long, so its other
--         tasks wait (parked); "" or 0 for none
-- ARGV[4] the (id, lease token) pairs, packed as extend.lua's
--         (leases_unpack in include/lease_pairs.lua)
-- Returns {due ms (now + delay), verdicts}: verdicts has one character per pair as given, 'h'
-- (held: released), 'c' (its task was cancelled while leased) or 'l' (lease lost); only the
-- held ones are released
-- @include clock
-- @include key_cooldown
-- @include key_limits
-- @include lease_pairs
-- @include leases
-- @include levels
-- @include meta
-- @include settings
-- @include stats
-- @include wake

local now = dueq_now(ARGV[1])
local due = now + tonumber(ARGV[2])
local hold_ms = tonumber(ARGV[3] or '') or 0
local ids, tokens, positions = leases_unpack(ARGV[4])
local held, verdicts = judge_leases(KEYS[2], KEYS[3], KEYS[6], ids, tokens, now)
local verdict = verdict_string(verdicts, positions, #held)
if #held == 0 then return {due, verdict} end
local levels = due_levels(KEYS[1])
local envelopes = redis.call('HMGET', KEYS[7], unpack(held))
-- the concurrency cap: a consumer may be sleeping capped; tell it a lease ends
local cap = settings_read(KEYS[10], KEYS[4], 'concurrency').concurrency
if cap and at_cap(KEYS[2], cap, now) then publish_wake(KEYS[5], ms(now)) end
local previous_heads, woken = {}, false  -- level key -> its head before these releases
for i, id in ipairs(held) do
  local envelope = envelopes[i] or nil
  local k_level = level_key(levels, envelope)
  if previous_heads[k_level] == nil then previous_heads[k_level] = head_score(k_level) or false end
  -- the key this lease is counted in (its meta names it: include/key_state.lua), also
  -- when its data is gone; the task's own key (the envelope's) is the one a cooldown holds
  local counted_key = lease_key(KEYS[3], id)
  local _, _, key = task_options(envelope)
  if not envelope then  -- its data is gone (evicted, deleted by hand)
    key = counted_key
    redis.log(redis.LOG_WARNING, '[dueq] released lease of ' .. id .. ' had no stored task ' ..
      '(evicted or deleted by hand)' .. (key and '; its key ' .. key .. ' released' or ''))
  end
  if counted_key and key_unlease(KEYS[8], KEYS[9], counted_key, now) and not woken then
    publish_wake(KEYS[5], ms(now))
    woken = true
  end
  -- KeyCooldown (issue 29): hold the task's key until now + the hold
  if key and hold_ms > 0 then key_hold(KEYS[8], KEYS[9], key, now + hold_ms, now) end
  redis.call('ZREM', KEYS[2], id)
  meta_unlease(KEYS[3], id, -1)
  redis.call('ZADD', k_level, due, id)
end
stat_incr(KEYS[4], 'released', #held)
-- one wake for the lot when a level's head moved earlier (wake_if_earlier's rule)
local earlier = false
for _, previous_head in pairs(previous_heads) do
  if previous_head == false or due < previous_head then earlier = true end
end
if earlier then publish_wake(KEYS[5], ms(due)) end
return {due, verdict}
