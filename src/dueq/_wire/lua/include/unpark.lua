-- unpark.lua (include): per-key limits: a task taken out of the parked set.
-- @include key_state
-- @include parked

-- Take a scheduled task with `key` (nil: none) out of the parked set, if it is parked there (or
-- in a fair queue's lane: its count in `k_fair_due` drops, and a lane left empty leaves the
-- fair set `k_fair`, include/fair.lua); true if it was.
local function unpark_one(k_parked, k_state, k_meta, key, priority, id, k_fair_due, k_fair)
  local member = parked_member_of(k_meta, key, priority, id)
  if member and redis.call('ZREM', k_parked, member) == 1 then
    if string.byte(member, 1) == 1 then  -- a lane's: no key count to drop
      local tenant = string.sub(member, 2, string.find(member, '\0', 2, true) - 1)
      if tonumber(redis.call('ZINCRBY', k_fair_due, -1, tenant)) <= 0 then
        redis.call('ZREM', k_fair_due, tenant)
        redis.call('ZREM', k_fair, tenant)
      end
      return true
    end
    local leased, mark, parked = key_state_parse(redis.call('HGET', k_state, key))
    key_state_write(k_state, {[key] = key_state_value(leased, mark, parked - 1, 0) or false})
    return true
  end
  return false
end
