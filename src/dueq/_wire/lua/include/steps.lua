-- steps.lua (include): the durable tasks' state, dropped when a task ends (issue 39).
-- @include chunked
--
-- The steps HASH holds, per durable task: field <id> its step log (include/step_log.lua),
-- <id>\0s its signals not yet taken, <id>\0p its recent progress (progress.lua). The scripts
-- that end a task (ack, cancel, expiry, purge, the dead set's trim, a replace) drop all
-- three; a dead task keeps them, so a replay goes on from its first unfinished step. A queue
-- that never ran a durable task has no steps key: one EXISTS per call, no HDEL.
local function steps_forget(k_steps, ids)
  if not k_steps or #ids == 0 or redis.call('EXISTS', k_steps) == 0 then return end
  local fields = {}
  for _, id in ipairs(ids) do
    fields[#fields + 1] = id
    fields[#fields + 1] = id .. '\0s'
    fields[#fields + 1] = id .. '\0p'
  end
  call_chunked('HDEL', k_steps, fields)
end
