-- spark_stage.lua: stage a streaming micro-batch's task records (DueqDataSource); the batch's
-- commit (spark_commit.lua) schedules them later, once, or its abort drops them.
--
-- KEYS[1] rows     LIST packed task records staged for this (query, batch), one element
--                  per call (struct '>BdHc0I4c0' records and their trailers back to back, as
--                  schedule.lua reads them)
-- KEYS[2] ids      SET ids staged for this (query, batch): a retried task adds nothing twice
-- KEYS[3] batches  HASH streaming query id -> "batch|state": the last batch that query began
--                  to commit ("s", sealed) or committed ("c")
-- ARGV[1] now ms, or "" for server TIME (unused: staging keeps no times)
-- ARGV[2] streaming query id
-- ARGV[3] batch id
-- ARGV[4] ms the staged rows are kept if no commit or abort comes (a crashed job's leftovers)
-- ARGV[5] the records, packed back to back
-- Returns {staged, duplicates}, or {-1, 0} when this batch of this query is already sealed or
--         committed (a replay or a late task attempt): nothing is staged
-- @include links
-- @include records

local query, batch = ARGV[2], tonumber(ARGV[3])
local record = redis.call('HGET', KEYS[3], query)
if record then
  local last = tonumber(string.match(record, '^(%d+)|'))
  if last and last >= batch then return {-1, 0} end
end

local blob = ARGV[5]
local fresh = {}
local staged, duplicates = 0, 0
local pos = 1
while pos <= #blob do
  local start = pos
  local flags, _, id
  flags, _, id, _, pos = struct.unpack('>BdHc0I4c0', blob, pos)
  pos = links.record_end(blob, pos, flags)
  if redis.call('SADD', KEYS[2], id) == 1 then
    fresh[#fresh + 1] = string.sub(blob, start, pos - 1)
    staged = staged + 1
  else
    duplicates = duplicates + 1
  end
end
if staged > 0 then
  redis.call('RPUSH', KEYS[1], table.concat(fresh))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
if staged + duplicates > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[4]) end
return {staged, duplicates}
