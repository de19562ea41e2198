-- leases.lua (include): whether a lease is held, and the concurrency cap.
-- @include claims
-- @include meta

-- Whether the queue holds at least `cap` live leases (deadline after now). ack, fail and
-- release ask before they end a lease, and wake consumers when it does: a consumer whose claim
-- found the queue at its concurrency cap sleeps until then (see claim.lua).
local function at_cap(k_leased, cap, now)
  return redis.call('ZCARD', k_leased) - redis.call('ZCOUNT', k_leased, '-inf', now) >= cap
end

-- A lease is held when the token matches and its deadline is still in the future: the token
-- in its meta value, or for a first lease without one, the deadline the token names
-- (include/claims.lua).
local function lease_held(k_leased, k_meta, id, token, now)
  local deadline = redis.call('ZSCORE', k_leased, id)
  if not deadline or tonumber(deadline) <= now then return false end
  local v = redis.call('HGET', k_meta, id)
  if not v then return claims.token_is(token, deadline) end
  local _, t = meta_parse(v)
  return t ~= '' and t == token
end

-- The verdict on one lease, as judge_leases gives it: 'h' held, 'c' cancelled, 'l' lost.
local function lease_verdict(k_leased, k_meta, k_cancelled, id, token, now)
  if lease_held(k_leased, k_meta, id, token, now) then return 'h' end
  if redis.call('ZSCORE', k_cancelled, id .. '|' .. token) then return 'c' end
  return 'l'
end
