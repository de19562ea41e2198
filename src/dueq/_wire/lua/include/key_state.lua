-- key_state.lua (include): per-key limits: the key-state values.
-- @include bulk
-- @include chunked

-- Per-key limits. A task scheduled with key= counts against its key's limits (the queue's
-- key_concurrency and key_rate settings) while it is leased. The key-state HASH holds one value
-- per key, "leased|mark|parked": its leased tasks, the earliest ms its rate admits its next
-- claim (GCRA's theoretical arrival time, without burst: claims of one key are spaced per/n
-- apart; empty when none is pending) and how many of its tasks are parked; a key with nothing
-- to remember has no field. A due task whose key is at a limit is parked (the parked ZSET,
-- every member scored 0 so that one ZRANGEBYLEX finds a key's tasks in priority and due order)
-- instead of blocking the tasks behind it, and the key-wait ZSET (key -> ms) says when a
-- key's parked tasks may be claimable again: when its rate admits the next claim, or now when
-- one of its leases ends. A parked task keeps its due ms in its meta value (token empty), so
-- it can be found by id.
-- Only a key with a limit (key_concurrency or key_rate, or its own key_limit:<key>) has its
-- leases counted: claim.lua appends "|<key>" to the meta of each lease it counts, and every
-- lease end releases the key its meta names (lease_key), so a count is never taken back twice
-- or for a lease it never held. Keyed tasks of a queue without key limits (and without key
-- state: a KeyCooldown's mark) cost a claim and an ack nothing for their keys. A change that
-- gives a key a limit counts that key's live leases then (configure.lua).
local key_state_parse, key_state_value, key_state_write
do

  -- A key-state value as leased, mark (0: none) and parked; an unreadable value reads as zeros.
  -- Parsed once per distinct value in a script call (key_state_seen): the keys one claim leased
  -- share their value ("1|<mark>|0"), so a batch of keys mostly parses one string.
  local key_state_seen = {}
  function key_state_parse(v)
    if not v then return 0, 0, 0 end
    local s = key_state_seen[v]
    if not s then
      local f, t, p = string.match(v, '^(%d+)|([%d.]*)|(%d+)$')
      s = {tonumber(f) or 0, tonumber(t) or 0, tonumber(p) or 0}
      key_state_seen[v] = s
    end
    return s[1], s[2], s[3]
  end

  -- The value to store for a key's state at `now`, or nil when there is nothing to remember.
  -- Built once per distinct (mark, leased, parked) in a script call (key_state_texts), for the
  -- same reason.
  local key_state_texts = {}
  function key_state_value(leased, mark, parked, now)
    local keep_mark = mark > now
    if leased <= 0 and parked <= 0 and not keep_mark then return nil end
    if leased < 0 then leased = 0 end
    if parked < 0 then parked = 0 end
    if not keep_mark then mark = 0 end
    local by_mark = key_state_texts[mark]
    if not by_mark then
      by_mark = {text = keep_mark and string.format('%.3f', mark) or ''}
      key_state_texts[mark] = by_mark
    end
    local by_leased = by_mark[leased]
    if not by_leased then
      by_leased = {}
      by_mark[leased] = by_leased
    end
    local v = by_leased[parked]
    if not v then
      v = leased .. '|' .. by_mark.text .. '|' .. parked
      by_leased[parked] = v
    end
    return v
  end

  -- Write key states: `values` maps key -> value or false (delete); one HSET and one HDEL.
  function key_state_write(k_state, values)
    local set, drop = {}, {}
    for key, v in pairs(values) do
      if v then
        set[#set + 1] = key
        set[#set + 1] = v
      else
        drop[#drop + 1] = key
      end
    end
    if #set > 0 then hset_many(k_state, set) end
    if #drop > 0 then call_chunked('HDEL', k_state, drop) end
  end
end
