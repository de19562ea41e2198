-- run_scores.lua (include): the scores of the first members of a ZSET, read by runs (claim.lua).

-- The scores (as Redis gives them) of `ids`, the first members of a ZSET in rank order. Members
-- that share a score are read as a run: ZSCORE of the run's first member, then ZCOUNT up to
-- that score says where the run ends (every member before it is in the run or an earlier one).
-- After 4 runs, the rest come with one ZMSCORE. Redis 7.0 formats every score it
-- replies with sprintf (about 3.6k instructions each); tasks scheduled together share their
-- due ms, so a claim of 1,000 of them reads one score instead of 1,000, and a claim of tasks
-- that all differ pays 8 small commands more than reading the scores with the ids.
local function run_scores(k_zset, ids)
  local out, n, i, runs = {}, #ids, 1, 0
  while i <= n and runs < 4 do
    local score = redis.call('ZSCORE', k_zset, ids[i])
    if not score then break end  -- (not reached: ids were just read from k_zset)
    local upto = math.max(math.min(redis.call('ZCOUNT', k_zset, '-inf', score), n), i)
    for j = i, upto do out[j] = score end
    i = upto + 1
    runs = runs + 1
  end
  for from = i, n, 4000 do
    local to = math.min(from + 3999, n)
    local rest = redis.call('ZMSCORE', k_zset, unpack(ids, from, to))
    for j = from, to do out[j] = rest[j - from + 1] end
  end
  return out
end
