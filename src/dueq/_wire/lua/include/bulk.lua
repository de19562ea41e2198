-- bulk.lua (include): many hash fields or ZSET members at once, in the big encoding.

-- HSET of field, value pairs and ZADD of score, member pairs (flat lists), in chunks. Redis 7.0
-- keeps a hash or a ZSET that is new (or small) as a listpack until it holds 128 entries, and
-- each entry added to a listpack scans it: 1,000 new fields into an empty hash cost about 1 us
-- each, against 0.2 us in a hashtable, and 1,000 leases into an empty leased set 4.4k Redis
-- instructions per task (callgrind: zzlFind and lpFind; Redis 7.2 sizes a new ZSET from the
-- batch by itself). The hot keys (meta, leased, key_state, due) empty out whenever a drain
-- catches up, so each claim would pay that again. A batch of more than 128 entries therefore
-- goes in behind one extra entry named HASHTABLE_FIELD, longer than the *-max-listpack-value
-- settings (64), which makes Redis build or convert the big encoding first, and which is
-- removed right after. That name is 1,000 bytes: no task id (MAX_ID_BYTES 512), limit key
-- (MAX_KEY_BYTES 200) or parked member (a key, an id and 16 bytes) can be as long, so it never
-- stands for real data.
local hset_many, zadd_many, zadd_all
do
  local HASHTABLE_FIELD = string.rep('\0', 1000)
  local function add_many(cmd, k, pairs_list, helper_a, helper_b, drop)
    local n = #pairs_list
    if n <= 256 then
      if n > 0 then redis.call(cmd, k, unpack(pairs_list)) end
      return
    end
    redis.call(cmd, k, helper_a, helper_b, unpack(pairs_list, 1, math.min(n, 4000)))
    for i = 4001, n, 4000 do
      redis.call(cmd, k, unpack(pairs_list, i, math.min(i + 3999, n)))
    end
    redis.call(drop, k, HASHTABLE_FIELD)
  end
  function hset_many(k_hash, pairs_list)
    add_many('HSET', k_hash, pairs_list, HASHTABLE_FIELD, '', 'HDEL')
  end
  function zadd_many(k_zset, pairs_list)
    add_many('ZADD', k_zset, pairs_list, 0, HASHTABLE_FIELD, 'ZREM')
  end

  -- ZADD every id with the same score.
  function zadd_all(k_zset, score, ids)
    local args = {}
    for _, id in ipairs(ids) do
      args[#args + 1] = score
      args[#args + 1] = id
    end
    zadd_many(k_zset, args)
  end
end
