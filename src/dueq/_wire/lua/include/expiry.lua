-- expiry.lua (include): the expiry of a task (its envelope head).
-- @include clock

-- Expiry (issue 29). A task scheduled with expires= carries its expiry, epoch ms, in a
-- version-3 envelope head (task_options); tasks without one keep their version-1 or 2 form.
-- schedule.lua turns a relative expiry (record flag 8: ms from now) into epoch ms on the queue
-- clock. claim.lua never leases a task past its expiry: it ends it "expired" (tasks_expire);
-- fail.lua ends a task whose next attempt would come at or after its expiry the same way, and
-- so does claim.lua for a lease that ran out (its retry judged as a failure's).
-- The counter is expired_tasks ("expired" counts leases that ran out).
local task_expired, expiry_absolute
do
  -- The expiry of a stored envelope, epoch ms, or nil.
  local function task_expires(envelope)
    if envelope and string.byte(envelope, 1) == 51 then
      return tonumber(string.match(envelope, '^3:%d|%d*|%d*|(%d+)|'))
    end
    return nil
  end

  -- Whether a stored envelope's expiry is at or before `at` ms (false: none, or unreadable).
  function task_expired(envelope, at)
    local expires = task_expires(envelope)
    return expires ~= nil and expires <= at
  end

  -- The envelope with its relative expiry (ms from now) made absolute.
  function expiry_absolute(envelope, now)
    local _, e, rel = string.find(envelope, '^3:%d|%d*|%d*|(%d+)|')
    if not e then return envelope end
    return string.sub(envelope, 1, e - #rel - 1) .. ms(now + tonumber(rel)) ..
      string.sub(envelope, e)
  end
end
