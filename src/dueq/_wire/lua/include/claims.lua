-- claims.lua (include): one record per claim, so that a first lease needs no meta value.
-- @include clock
--
-- A claim leases its tasks under one deadline D (their score in leased) and one token
-- "<D>@<holder>" ("<D>" without a holder). D is made unique among every claim of the queue:
-- claims_issue moves it on by 1 ms while the claims ZSET (KEYS: claims, score D, member
-- "<D>|<claimed ms>|<holder>") already holds it. A record is trimmed only once its D is
-- claims.GRACE_MS in the past, and a new claim's D is after now, so no D is ever issued
-- twice (with a clock that does not run backwards). So a leased entry whose task has no meta
-- value is the first lease of that task, and it is held by token T exactly when its deadline
-- is T's D and is after now: a holder of an earlier lease of the same id (acked, cancelled or
-- dead, and the id scheduled again) has another D. That is the whole fence; claim.lua writes
-- no meta value for a first delivery without a counted key.
--
-- Whatever extends such a lease, or reads its attempt record, makes its meta value from the
-- record (claims.meta): "1|<token>||<claimed ms>" (the due ms it was claimed at is not kept:
-- "" reads as unknown). A record trimmed before its lease was reclaimed (a lease expired more
-- than claims.GRACE_MS ago) gives the token "<D>" and first-claim D less the lease length
-- given, or D.

-- A record is kept while its leases may live unextended and GRACE_MS more, for the claim that
-- reclaims them (their holder and claim time, so that a worker's expired leases are named after
-- an outage of up to 10 minutes), but once the set holds more than MOST records, only the live
-- ones (D after now) are kept: a busy queue keeps (claims per second) x (lease length) of them.
-- Either way D stays unique.
-- (One local, the table claims: most scripts include this through meta.lua.)
local claims = {GRACE_MS = 600000, MOST = 10000}

-- Issue this claim's deadline and token (`now` + lease_ms, moved on while another claim holds
-- it), record it and trim records past their grace. Returns D, its text and the token.
function claims.issue(k_claims, now, lease_ms, holder)
  local d = now + lease_ms
  while redis.call('ZCOUNT', k_claims, d, d) > 0 do d = d + 1 end
  local d_text = ms(d)
  local token = holder == '' and d_text or d_text .. '@' .. holder
  local floor = now - claims.GRACE_MS
  if redis.call('ZCARD', k_claims) > claims.MOST then floor = now end
  redis.call('ZREMRANGEBYSCORE', k_claims, '-inf', '(' .. ms(floor))
  redis.call('ZADD', k_claims, d, d_text .. '|' .. ms(now) .. '|' .. holder)
  return d, d_text, token
end

-- The token and claimed ms of the claim whose deadline is `deadline` (the text of a leased
-- score), from its record; without one, "<D>" and the claimed ms `lease_ms` before D (or D).
function claims.lookup(k_claims, deadline, lease_ms)
  local d = tonumber(deadline)
  local d_text = ms(d)
  local record = redis.call('ZRANGEBYSCORE', k_claims, d_text, d_text, 'LIMIT', 0, 1)[1]
  if record then
    local at, holder = string.match(record, '^%d+|(%d+)|(.*)$')
    if at then return holder == '' and d_text or d_text .. '@' .. holder, at end
  end
  return d_text, ms(d - (lease_ms or 0))
end

-- The meta value claim.lua would have written for the first lease whose deadline is
-- `deadline`: "1|<token>||<claimed ms>".
function claims.meta(k_claims, deadline, lease_ms)
  local token, at = claims.lookup(k_claims, deadline, lease_ms)
  return '1|' .. token .. '||' .. at
end

-- Whether a lease token names the deadline `deadline` (a leased score's text): the fence of a
-- first lease, which has no meta value.
function claims.token_is(token, deadline)
  local d = string.match(token, '^(%d+)')
  return d ~= nil and tonumber(d) == tonumber(deadline)
end
