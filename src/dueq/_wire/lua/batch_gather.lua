-- batch_gather.lua: a sharded queue's batch as a whole, on its home shard (the shard of the
-- batch id; see dueq.sharding.batches). Every shard keeps its own part of the batch as a plain
-- queue keeps a batch (include/batches.lua: members counted, outcomes settled); a part, once
-- closed with nothing pending, schedules its note task on its own shard, and whoever claims a
-- note tells the home shard here ("parts"). The home marks each part once; when every part has
-- completed, it schedules the completion task exactly once (this script is atomic on one shard,
-- a part already marked changes nothing, and the completion record is deleted as it is
-- scheduled), so a note delivered twice (a consumer killed after this call) is harmless.
--
-- KEYS[1] due          ZSET id -> due ms (the completion task's level 0)
-- KEYS[2] tasks        HASH id -> envelope
-- KEYS[3] stats        HASH counter -> int
-- KEYS[4] wake         Pub/Sub channel, told when the completion task is due earliest
-- KEYS[5] history      HASH "<minute>|<counter>" -> count (see include/stats.lua)
-- KEYS[6] gather       HASH batch id -> "parts|done|created_ms|closed_ms|completed_ms|taken":
--                      done has one character per part, "1" once that part has completed
-- KEYS[7] gather_on    HASH batch id -> the completion task's packed record, until scheduled
-- KEYS[8] gather_ended ZSET batch id -> completed ms (for trimming, as batch_ended)
-- KEYS[9..17] upper_due: the due ZSETs of priorities 1 to 9
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] "open" (close_batch, before any part is closed) or "parts" (parts have completed)
-- ARGV[3] batch id
-- open:  ARGV[4] the number of parts; ARGV[5] the completion task as one schedule.lua record
--        ('>BdHc0I4c0'), or "" for none
-- parts: ARGV[4..] the indexes (from 0) of parts that have completed
-- Returns {status, record}: open: 1 opened now, 0 opened before (left as it was), -1 the
--         completion task's id is a task of the queue (nothing written); parts: 1 when this
--         call completed the batch, else 0 (record "" for a batch never opened, or trimmed: the
--         note is dropped)
-- @include batches
-- @include clock
-- @include levels
-- @include links
-- @include stats

local now = dueq_now(ARGV[1])
history_use(KEYS[5], ARGV[1])
local batch = ARGV[3]
local raw = redis.call('HGET', KEYS[6], batch)
local g = {}
if raw then
  for field in string.gmatch(raw .. '|', '([^|]*)|') do g[#g + 1] = field end
end

local function text()
  return table.concat({g[1], g[2], g[3], g[4] or '', g[5] or '', g[6] or ''}, '|')
end

if ARGV[2] == 'open' then
  if raw then return {0, raw} end
  if ARGV[5] ~= '' then
    local _, _, id = struct.unpack('>BdHc0I4c0', ARGV[5])
    if redis.call('HEXISTS', KEYS[2], id) == 1 then return {-1, ''} end
    redis.call('HSET', KEYS[7], batch, ARGV[5])
  end
  g = {ms(tonumber(ARGV[4])), string.rep('0', tonumber(ARGV[4])), ms(now), ms(now), '', ''}
  raw = text()
  redis.call('HSET', KEYS[6], batch, raw)
  return {1, raw}
end

if not raw then return {0, ''} end
if g[5] ~= '' then return {0, raw} end
local done = g[2]
for i = 4, #ARGV do
  local part = tonumber(ARGV[i])
  if part and part >= 0 and part < #done then
    done = string.sub(done, 1, part) .. '1' .. string.sub(done, part + 2)
  end
end
g[2] = done
local _, marked = string.gsub(done, '1', '')
-- batch_finish takes a batch record: here total = parts and acked = parts completed
local b = {#done, marked, 0, 0, 0, tonumber(g[3]) or now, tonumber(g[4]) or now, false}
local bk = links.batch_keys(KEYS[6], nil, KEYS[7], KEYS[8], due_levels(KEYS[1]), KEYS[2], KEYS[3],
  KEYS[4])
links.batch_finish(bk, batch, b, now)
local completed = 0
if b[8] then
  completed = 1
  g[5] = ms(b[8])
  if b[9] == 1 then g[6] = '1' end
end
raw = text()
redis.call('HSET', KEYS[6], batch, raw)
return {completed, raw}
