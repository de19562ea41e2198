-- key_limits.lua (include): per-key limits: the leases of keys ending.
-- @include bulk
-- @include chunked
-- @include key_state
-- @include meta

-- The key whose leased count the lease of `id` is counted in (its meta's "|<key>"), or nil:
-- the key every lease end releases (a lease of a key without limits was never counted).
local function lease_key(k_meta, id)
  return select(6, meta_parse(redis.call('HGET', k_meta, id)))
end

-- Leases of these keys ended (`keys` names a key once per lease: acked, failed, released,
-- expired, cancelled or replaced): their leased counts drop, rate marks that lie in the past
-- are dropped, and keys with parked tasks are made ready for the next claim. One HMGET, HSET,
-- HDEL and ZADD for any number of keys. True when consumers should be woken.
local function keys_release(k_state, k_wait, keys, now)
  local ended, order, n = {}, {}, 0
  for i = 1, #keys do
    local key = keys[i]
    local c = ended[key]
    if c then
      ended[key] = c + 1
    else
      ended[key] = 1
      n = n + 1
      order[n] = key
    end
  end
  if n == 0 then return false end
  local values = hmget_chunked(k_state, order)
  local set, drop, ready, n_set, n_drop, n_ready = {}, {}, {}, 0, 0, 0
  -- the last value read and its parts: the keys one claim leased share one value
  local seen, leased, mark, parked = nil, 0, 0, 0
  for i = 1, n do
    local key, value = order[i], values[i]
    if value ~= seen then
      leased, mark, parked = key_state_parse(value)
      seen = value
    end
    local left = leased - ended[key]
    -- nothing left to remember (key_state_value's nil, tested inline: the common case)
    local v = not (left <= 0 and parked <= 0 and mark <= now)
      and key_state_value(left, mark, parked, now)
    if v then
      set[n_set + 1], set[n_set + 2] = key, v
      n_set = n_set + 2
    else
      n_drop = n_drop + 1
      drop[n_drop] = key
    end
    if parked > 0 then
      ready[n_ready + 1], ready[n_ready + 2] = now, key
      n_ready = n_ready + 2
    end
  end
  if n_set > 0 then hset_many(k_state, set) end
  if n_drop > 0 then call_chunked('HDEL', k_state, drop) end
  if n_ready > 0 then zadd_chunked(k_wait, 'LT', ready) end
  return n_ready > 0
end

-- keys_release for one lease of `key`.
local function key_unlease(k_state, k_wait, key, now)
  return keys_release(k_state, k_wait, {key}, now)
end
