-- parked.lua (include): per-key limits: members of the parked set.
-- @include meta

local function parked_member(key, priority, due_ms, id)
  return key .. '\0' .. (9 - priority) .. string.format('%015d', due_ms) .. id
end

-- The priority, due ms and id of a parked member of `key`, or nil when it cannot be read.
local function parked_parse(member, key)
  local rest = string.sub(member, #key + 2)
  local inverted, due, id = string.match(rest, '^(%d)(%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(.+)$')
  if not inverted then return nil end
  return 9 - tonumber(inverted), tonumber(due), id
end

-- The parked member of a task with `key` (nil: none) whose meta value holds its due ms, or
-- nil. A task in a fair queue's lane has "|\1<tenant>" after its meta (include/fair.lua): its
-- member is in that lane, whatever its key.
local function parked_member_of(k_meta, key, priority, id)
  local _, token, due, _, _, lane = meta_parse(redis.call('HGET', k_meta, id))
  if token ~= '' or due == '' then return nil end
  if lane and string.byte(lane, 1) == 1 then
    return parked_member(lane, priority, tonumber(due), id)
  end
  if not key then return nil end
  return parked_member(key, priority, tonumber(due), id)
end
