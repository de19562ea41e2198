-- key_cooldown.lua (include): per-key limits: a key held back (KeyCooldown).
-- @include key_state

-- Hold a key until `until_ms` (a handler's KeyCooldown, release.lua): its rate mark moves there
-- (claim.lua parks the key's due tasks while its mark lies ahead, whatever its limits), and its
-- parked tasks wait until then.
local function key_hold(k_state, k_wait, key, until_ms, now)
  local leased, mark, parked = key_state_parse(redis.call('HGET', k_state, key))
  if until_ms > mark then mark = until_ms end
  key_state_write(k_state, {[key] = key_state_value(leased, mark, parked, now) or false})
  if parked > 0 then redis.call('ZADD', k_wait, mark, key) end
end
