-- wake.lua (include): the wake and ended channels.
-- @include clock

-- Publish a message on the queue's wake channel. SPUBLISH (sharded Pub/Sub, Redis >= 7.0)
-- keeps it on the nodes that serve the channel's slot, where a Cluster would forward a plain
-- PUBLISH to every node. A server without SPUBLISH (6.2), or an ACL user without +spublish,
-- publishes the classic way; the listeners (dueq._consume.wake) subscribe the same way by server version.
local function publish_wake(k_wake, message)
  local sent = redis.pcall('SPUBLISH', k_wake, message)
  if type(sent) == 'table' and sent.err then
    redis.call('PUBLISH', k_wake, message)
  end
end

-- Publish on the wake channel when due_ms is earlier than the head that was there before.
local function wake_if_earlier(k_wake, previous_head, due_ms)
  if previous_head == nil or due_ms < previous_head then
    publish_wake(k_wake, ms(due_ms))
  end
end

-- Publish the ids of tasks that ended (SPUBLISH where there is, as publish_wake does).
local function publish_ended(k_ended, ids)
  if #ids == 0 then return end
  local parts = {}
  for i, id in ipairs(ids) do parts[i] = struct.pack('>Hc0', #id, id) end
  publish_wake(k_ended, table.concat(parts))
end
