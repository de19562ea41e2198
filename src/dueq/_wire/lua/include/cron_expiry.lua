-- cron_expiry.lua (include): the expiry of cron occurrences.
-- @include cron_outcome
-- @include expiry

-- Cron occurrences with an expiry (issue 29: cron.add(..., expires=)). The definition's
-- envelope carries the expiry as ms after the slot, in a version-3 head; each occurrence is
-- stored with it made absolute from its own nominal slot (before jitter; cron_expiring). The
-- pending occurrence is stored without it (version 2, cron_pending), so claim.lua always hands
-- it to the keeper and the schedule moves on: cron_advance writes its expiry into it when it
-- is claimed (and ends it expired then if it is late). Envelopes of other heads pass unchanged.
local cron_expiring, cron_pending
do
  -- Epoch ms of the slot an occurrence id names ("cron:<name>:<label>", run_now's asked second).
  local function cron_slot_ms(id)
    local _, label = cron_occurrence(id)
    local y, mo, d, h, mi, s = string.match(label or '',
      '^(%d%d%d%d)(%d%d)(%d%d)T(%d%d)(%d%d)(%d%d)Z$')
    if not y then return nil end
    y, mo = tonumber(y), tonumber(mo)
    if mo <= 2 then y = y - 1 end
    local era = math.floor(y / 400)
    local yoe = y - era * 400
    local doy = math.floor((153 * ((mo + 9) % 12) + 2) / 5) + tonumber(d) - 1
    local days = era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
      - 719468
    return (((days * 24 + tonumber(h)) * 60 + tonumber(mi)) * 60 + tonumber(s)) * 1000
  end

  -- A definition's envelope as one occurrence stores it: its relative expiry counted from
  -- `base` ms (nil: the slot its id names; an id naming none counts from 0, so expired).
  function cron_expiring(envelope, id, base)
    if string.byte(envelope, 1) ~= 51 then return envelope end
    return expiry_absolute(envelope, base or cron_slot_ms(id) or 0)
  end

  -- A definition's envelope as its pending occurrence stores it: without the expiry.
  function cron_pending(envelope)
    if string.byte(envelope, 1) ~= 51 then return envelope end
    local _, e, expiry_at = string.find(envelope, '^3:%d|%d*|%d*|()%d+|')
    if not e then return envelope end
    return '2:' .. string.sub(envelope, 3, expiry_at - 1) .. string.sub(envelope, e + 1)
  end
end
