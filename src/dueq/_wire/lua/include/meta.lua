-- meta.lua (include): meta values, each task's attempt record.
-- meta values are "attempt|token|due_ms|first_ms": deliveries so far, the live lease token (""
-- when not leased), the due time the current delivery was claimed at, and when the task was
-- first claimed (the start of its retry history, as tenacity counts it); a lease counted
-- against its limit key's leased count has "|<key>" after them (see the per-key notes in
-- key_state.lua: only leases of a key with a limit are counted). A task leased for its first
-- attempt without a counted key has none (claim.lua writes none: its lease is fenced by its
-- claim's unique deadline, include/claims.lua); meta_get makes the value it would have had.
-- @include claims

-- Every script checks what it reads before its first write: Redis has no rollback, so a
-- script that fails half way keeps its earlier writes. Values that cannot be read are repaired
-- or reported (never an error), so corrupted data costs at most the one task it belongs to.

-- Most attempts a meta value may count; a larger number is corrupted data.
local MAX_ATTEMPT = 1000000000

-- A meta value as attempt, token, due ms, first-claim ms, whether it was readable (a missing
-- value is readable: the task was never claimed), and the limit key of a leased task with one
-- (claim.lua appends "|<key>" to the meta of such a lease, so ending it needs no envelope).
local function meta_parse(v)
  if not v then return 0, '', '', '', true, nil end
  -- `rest` is where the part after first_ms starts (a position: no string is made for it)
  local a, t, d, f, rest = string.match(v, '^(%d+)|([^|]*)|(%d*)|(%d*)()')
  local attempt = tonumber(a)
  if not attempt or attempt > MAX_ATTEMPT or #d > 16 or #f > 16 then
    return 0, '', '', '', false, nil
  end
  local key = nil
  if rest <= #v then  -- "|<key>", the key not empty
    if rest == #v or string.byte(v, rest) ~= 124 then return 0, '', '', '', false, nil end
    key = string.sub(v, rest + 1)
  end
  return attempt, t, d, f, true, key
end

-- The meta value of `id`; for a leased task without one (a first lease, claim.lua wrote none),
-- the value its claim's record gives (claims.meta); nil for a task never claimed.
local function meta_get(k_meta, k_leased, k_claims, id)
  local v = redis.call('HGET', k_meta, id)
  if v then return v end
  local deadline = redis.call('ZSCORE', k_leased, id)
  if not deadline then return nil end
  return claims.meta(k_claims, deadline)
end

-- Keep attempt and first-claim time, drop the lease: the task is no longer leased. Call it
-- while the task is still in leased (a first lease's value is made from its entry there).
local function meta_unlease(k_meta, k_leased, k_claims, id, attempt_delta)
  local a, _, _, f = meta_parse(meta_get(k_meta, k_leased, k_claims, id))
  a = math.max(a + attempt_delta, 0)
  redis.call('HSET', k_meta, id, a .. '|||' .. f)
  return a
end
