-- cron_state.lua (include): cron_state values, and withdrawing a pending occurrence.
-- @include epoch_ms
-- @include levels
-- @include stats
-- @include tasks

-- cron_state values are "head_ms|last_ms|head_id": the pending occurrence and the last fired
-- slot of one cron definition.
-- The last instant a slot may have: 9999-12-31T23:59:59.999Z (Python's datetime ends there).
local ms_text_ok, cron_state_read, cron_withdraw
do
  local MAX_SLOT_MS = MAX_MS

  function ms_text_ok(s, may_be_empty)
    if s == '' then return may_be_empty end
    return #s <= 15 and string.match(s, '^%d+$') ~= nil and tonumber(s) <= MAX_SLOT_MS
  end

  -- head_ms, last_ms (text, last may be '') and head_id of a cron_state value, or nil when the
  -- value is missing or not "<ms>|<ms or empty>|cron:<name>:<YYYYMMDDTHHMMSSZ>".
  function cron_state_read(v, name)
    if not v then return nil end
    local head, last, id = string.match(v, '^(%d+)|(%d*)|(.*)$')
    if not head or not ms_text_ok(head, false) or not ms_text_ok(last, true) then return nil end
    local prefix = 'cron:' .. name .. ':'
    if #id ~= #prefix + 16 or string.sub(id, 1, #prefix) ~= prefix
        or not string.match(string.sub(id, #prefix + 1), '^%d%d%d%d%d%d%d%dT%d%d%d%d%d%dZ$') then
      return nil
    end
    return head, last, id
  end

  -- Withdraw a cron definition's pending occurrence if it is still waiting in the due ZSET of
  -- its priority (levels: due_levels; one already leased or retrying runs out); it counts as
  -- cancelled.
  function cron_withdraw(levels, k_tasks, k_meta, k_errors, k_stats, id)
    if not id or id == '' then return end
    local envelope = redis.call('HGET', k_tasks, id)
    local k_level = envelope and level_key(levels, envelope)
    if k_level and redis.call('ZREM', k_level, id) == 1 then
      forget(k_tasks, k_meta, k_errors, id)
      stat_incr(k_stats, 'cancelled', 1)
    end
  end
end
