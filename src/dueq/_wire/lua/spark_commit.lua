-- spark_commit.lua: one step of committing a staged streaming micro-batch (DueqDataSource).
-- A step that finds staged records schedules one staged element (at most batch_size records)
-- with schedule_records, the body of schedule.lua, so the records are scheduled exactly as
-- schedule_many would (never replacing a task), and popping them from the stage and
-- scheduling them is one atomic step. The caller repeats until the batch is committed.
--
-- KEYS[1] due      \
-- KEYS[2] tasks     |
-- KEYS[3] meta      |
-- KEYS[4] errors    |
-- KEYS[5] leased    |  schedule.lua's keys, in its order
-- KEYS[6] dead      |
-- KEYS[7] stats     |
-- KEYS[8] wake      |
-- KEYS[9] done      |
-- KEYS[10] config   |
-- KEYS[11] key_state |
-- KEYS[12] parked   |
-- KEYS[13] key_wait  |
-- KEYS[14] history  |
-- KEYS[15] debounce |
-- KEYS[16] batches  |
-- KEYS[17] batch_of |
-- KEYS[18] batch_on |
-- KEYS[19] batch_ended |
-- KEYS[20] waiting  |
-- KEYS[21] after    |
-- KEYS[22] children |
-- KEYS[23] results  /
-- KEYS[24] rows    LIST staged records of this (query, batch) (see spark_stage.lua)
-- KEYS[25] ids     SET ids staged for this (query, batch)
-- KEYS[26] batches HASH streaming query id -> "batch|state" (state "s" sealed, "c" committed)
-- KEYS[27] queries ZSET streaming query id -> last commit ms (forgets queries idle too long)
-- KEYS[28] fair    ZSET tenant -> virtual time: a fair queue's lanes (include/fair.lua)
-- KEYS[29] fair_due ZSET tenant -> tasks in its lane (include/fair.lua)
-- KEYS[30..38] upper_due: schedule.lua's due ZSETs of priorities 1 to 9 (the last nine KEYS)
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] "0" (schedule.lua's ARGV[2]: never replace; not read) and ARGV[3] (unused)
-- ARGV[4] remember-done window ms: schedule.lua's
-- ARGV[5] streaming query id
-- ARGV[6] batch id
-- ARGV[7] ms a query's last batch is remembered after its last commit
-- Returns {added, existing, replaced, ...} (schedule.lua's reply: one staged element was
--         scheduled; call again), or {-1} the batch is committed now, {-2} it was committed
--         before (a replay: nothing scheduled, its stage dropped), {-3, batch} an earlier
--         batch of this query was sealed and never finished
-- @include clock
-- @include schedule_records

local query, batch = ARGV[5], tonumber(ARGV[6])
local record = redis.call('HGET', KEYS[26], query)
local sealed = false
if record then
  local last, state = string.match(record, '^(%d+)|(%a)$')
  last = tonumber(last)
  if last and (last > batch or (last == batch and state == 'c')) then
    redis.call('DEL', KEYS[24], KEYS[25])
    return {-2}
  end
  if last and last < batch and state == 's' then return {-3, last} end
  sealed = last == batch
end
if not sealed then
  -- From here on no task may stage for this batch (spark_stage.lua refuses), so what is
  -- staged is final, and a commit that stops half way is finished by the replay's commit.
  redis.call('HSET', KEYS[26], query, batch .. '|s')
  redis.call('PERSIST', KEYS[24])
end

local staged = redis.call('LPOP', KEYS[24])
if not staged then
  local now = dueq_now(ARGV[1])
  redis.call('HSET', KEYS[26], query, batch .. '|c')
  redis.call('DEL', KEYS[25])
  redis.call('ZADD', KEYS[27], now, query)
  local idle = redis.call('ZRANGEBYSCORE', KEYS[27], '-inf', '(' .. ms(now - tonumber(ARGV[7])),
    'LIMIT', 0, 100)
  for _, old in ipairs(idle) do
    redis.call('HDEL', KEYS[26], old)
    redis.call('ZREM', KEYS[27], old)
  end
  return {-1}
end
return schedule_records(false, staged, ARGV[4], nil, {lanes = KEYS[28], counts = KEYS[29]})
