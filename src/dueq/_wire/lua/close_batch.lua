-- close_batch.lua: close a batch: it takes no completion task after this one, and once nothing
-- is pending its completion task is scheduled (here, when every member has ended already).
-- See include/batches.lua.
--
-- KEYS[1] due      ZSET id -> due ms (the completion task's level 0)
-- KEYS[2] tasks    HASH id -> envelope
-- KEYS[3] stats    HASH counter -> int
-- KEYS[4] wake     Pub/Sub channel, told when the completion task is due earliest
-- KEYS[5] history  HASH "<minute>|<counter>" -> count: per-minute counts (see include/stats.lua)
-- KEYS[6] batches  HASH batch id -> record (see include/batches.lua)
-- KEYS[7] batch_on HASH batch id -> the completion task's packed record, until scheduled
-- KEYS[8] batch_ended ZSET batch id -> completed ms (for trimming)
-- KEYS[9..17] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] batch id
-- ARGV[3] the completion task as one schedule.lua record ('>BdHc0I4c0'), or "" for none
-- Returns {closed, record}: closed 1 when this call closed it, 0 when it was closed before
--         (its completion task is left as it was), -1 when the completion task's id is taken
--         by a task of the queue (any state in the tasks HASH: it could never be scheduled),
--         nothing written; record is the batch's record after the call
-- @include batches
-- @include clock
-- @include levels
-- @include links
-- @include stats

local now = dueq_now(ARGV[1])
history_use(KEYS[5], ARGV[1])
local batch = ARGV[2]
local b = links.batch_parse(redis.call('HGET', KEYS[6], batch)) or {0, 0, 0, 0, 0, now, false, false}
if b[7] then return {0, links.batch_text(b)} end
if ARGV[3] ~= '' then
  local _, _, id = struct.unpack('>BdHc0I4c0', ARGV[3])
  if redis.call('HEXISTS', KEYS[2], id) == 1 then return {-1, links.batch_text(b)} end
end
b[7] = now
if ARGV[3] ~= '' then redis.call('HSET', KEYS[7], batch, ARGV[3]) end
local bk = links.batch_keys(KEYS[6], nil, KEYS[7], KEYS[8], due_levels(KEYS[1]), KEYS[2], KEYS[3],
  KEYS[4])
links.batch_finish(bk, batch, b, now)
local record = links.batch_text(b)
redis.call('HSET', KEYS[6], batch, record)
return {1, record}
