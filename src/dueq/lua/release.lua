-- release.lua: give a leased task back without counting the delivery as an attempt.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] meta     HASH id -> "attempt|token|due_ms|first_ms"
-- KEYS[4] stats    HASH counter -> int
-- KEYS[5] wake     Pub/Sub channel (also told when a lease ends at the concurrency cap)
-- KEYS[6] cancelled ZSET "id|token" -> lease deadline ms: leases revoked by cancel.lua
-- KEYS[7] tasks    HASH id -> envelope (read for the task's priority)
-- KEYS[8] key_state HASH per-key counts (see the prelude's per-key notes)
-- KEYS[9] key_wait ZSET key -> ms when its parked tasks may be claimable again
-- KEYS[10] config   HASH setting -> value (concurrency: see the prelude's settings)
-- KEYS[11..19] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] id
-- ARGV[3] lease token
-- ARGV[4] delay ms before it is due again
-- ARGV[5] key hold ms (a KeyCooldown): the task's limit key is held that long, so its other
--         tasks wait (parked); "" or 0 for none
-- Returns the new due ms, -1 when the lease is lost, -2 when the task was cancelled while leased

local now = dueq_now(ARGV[1])
local id = ARGV[2]
local verdict = lease_verdict(KEYS[2], KEYS[3], KEYS[6], id, ARGV[3], now)
if verdict == 'c' then return -2 end
if verdict == 'l' then return -1 end
local due = now + tonumber(ARGV[4])
local envelope = redis.call('HGET', KEYS[7], id)
local k_level = level_key(due_levels(KEYS[1]), envelope)
-- the key this lease is counted in (its meta names it: the prelude's per-key notes), also
-- when its data is gone; the task's own key (the envelope's) is the one a cooldown holds
local counted_key = lease_key(KEYS[3], id)
local _, _, key = task_options(envelope)
if not envelope then  -- its data is gone (evicted, deleted by hand)
  key = counted_key
  redis.log(redis.LOG_WARNING, '[dueq] released lease of ' .. id .. ' had no stored task ' ..
    '(evicted or deleted by hand)' .. (key and '; its key ' .. key .. ' released' or ''))
end
if counted_key and key_unlease(KEYS[8], KEYS[9], counted_key, now) then
  publish_wake(KEYS[5], ms(now))
end
-- KeyCooldown (issue 29): hold the task's key until now + ARGV[5]
local hold_ms = tonumber(ARGV[5] or '') or 0
if key and hold_ms > 0 then key_hold(KEYS[8], KEYS[9], key, now + hold_ms, now) end
-- the concurrency cap: a consumer may be sleeping capped; tell it a lease ends
local cap = settings_read(KEYS[10], KEYS[4], 'concurrency').concurrency
if cap and at_cap(KEYS[2], cap, now) then publish_wake(KEYS[5], ms(now)) end
local previous_head = head_score(k_level)
redis.call('ZREM', KEYS[2], id)
meta_unlease(KEYS[3], id, -1)
redis.call('ZADD', k_level, due, id)
stat_incr(KEYS[4], 'released', 1)
wake_if_earlier(KEYS[5], previous_head, due)
return due
