-- spark_abort.lua: drop what a failed streaming micro-batch staged (DueqDataSource), unless
-- that batch's commit has begun (sealed): then its staged records wait for the replay's commit.
--
-- KEYS[1] rows     LIST staged records of this (query, batch) (see spark_stage.lua)
-- KEYS[2] ids      SET ids staged for this (query, batch)
-- KEYS[3] batches  HASH streaming query id -> "batch|state"
-- ARGV[1] now ms, or "" for server TIME (unused)
-- ARGV[2] streaming query id
-- ARGV[3] batch id
-- Returns 1 when the stage was dropped, 0 when it is kept (sealed for a commit to finish)

if redis.call('HGET', KEYS[3], ARGV[2]) == ARGV[3] .. '|s' then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
