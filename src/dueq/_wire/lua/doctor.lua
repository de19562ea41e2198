-- doctor.lua: check (and with fix, repair) a queue's derived state, one bounded batch a call.
-- Touches no task but the tasks of a dependency cycle: due, leased, tasks, meta, errors and dead
-- stay as they are. What it repairs is state derived from them: the per-key counts
-- (key_state), the key-wait entries, the stats field rate_in_window and the fair set's
-- entries (a fair queue's lanes stay as they are). Tasks without data are only reported
-- (claim.lua drops them). The one repair that ends tasks is of a dependency
-- cycle, whose tasks can never run: with fix they end dead (error DependencyCycle), as if a
-- parent had failed, and their children outside the cycle are settled as for any dead parent.
--
-- KEYS[1] due      ZSET id -> due ms
-- KEYS[2] leased   ZSET id -> lease deadline ms
-- KEYS[3] tasks    HASH id -> envelope (only HEXISTS)
-- KEYS[4] meta     HASH id -> "attempt|token|due_ms|first_ms[|key]"
-- KEYS[5] stats    HASH counter -> int (rate_in_window: the sum of the rate window's entries)
-- KEYS[6] rate     ZSET "<n>*<token>" -> claimed-at ms: the claims of the last rate window
-- KEYS[7] key_state HASH key -> "leased|next rate slot ms|parked" (see include/key_state.lua)
-- KEYS[8] parked   ZSET (scores 0) "<key>\0<9 - priority><due ms, 15 digits><id>"
-- KEYS[9] key_wait ZSET key -> ms when its parked tasks may be claimable again
-- KEYS[10] waiting ZSET id -> due ms: tasks waiting for parents (include/dependencies.lua)
-- KEYS[11] after   HASH id -> "<parents not finished>|<policy>|<parents>"
-- KEYS[12] children ZSET (scores 0) "<parent>\0<child>": one member per waiting edge
-- KEYS[13] dead    ZSET id -> died-at ms (the "cycles" repair ends a cycle's tasks dead)
-- KEYS[14] errors  HASH id -> JSON list of error records
-- KEYS[15] config  HASH setting -> value (events_ms: see include/settings.lua)
-- KEYS[16] events  STREAM outcome events (written only when events_ms > 0)
-- KEYS[17] ended   Pub/Sub channel: the ids of tasks that ended (for q.wait)
-- KEYS[18] history HASH "<minute>|<counter>" -> count (a batch's completion task scheduled)
-- KEYS[19] wake    Pub/Sub channel: told when a child released by the repair is due earlier
-- KEYS[20] batches HASH batch id -> record (see include/batches.lua)
-- KEYS[21] batch_of HASH id -> batch id: the members of batches that have not ended
-- KEYS[22] batch_on HASH batch id -> completion task record (a member ended may complete it)
-- KEYS[23] batch_ended ZSET batch id -> completed ms (for trimming)
-- KEYS[24] fair    ZSET tenant -> virtual time: the lanes with tasks (include/fair.lua)
-- KEYS[25..33] upper_due: the due ZSETs of priorities 1 to 9 (last: include/levels.lua)
-- ARGV[1] now ms, or "" for server TIME
-- ARGV[2] phase: "keys", "waits", "fair", "rate", "orphans" or "cycles" (the caller runs each
--         until its cursor comes back "")
-- ARGV[3] cursor: "" to start a phase, else what the previous call of the phase returned
-- ARGV[4] batch: most keys (or lanes), wait or fair entries, or task ids looked at in this call
-- ARGV[5] "1" to repair what is found, "" to report only (then nothing is written)
-- ARGV[6] lease cap: most leases counted in one call (more: leased counts are not checked)
-- ARGV[7] edge cap: most dependency edges one "cycles" call follows
-- Returns {cursor ("" when the phase is done), looked_at, note ("" or what was not checked),
--          what1, subject1, found1, expected1, fixed1 (1 or 0), what2, ...}; found and
--          expected are integers, strings, or nil for "none".
--
-- Findings (what, subject):
--   key_leased (key): its leased count differs from the leases whose meta names the key
--   key_parked (key): its parked count differs from its members of the parked set
--   key_state_unreadable (key): the value cannot be read (claims read it as zeros)
--   key_wait_stale (key): a key-wait entry of a key with no parked task
--   rate_in_window (the field): the stats sum differs from the sum of the rate window's entries
--   leased_without_data, due_without_data, parked_without_data (task id): report only
--   parked_unreadable (the member): a parked member that names no key (report only)
--   fair_lane_unlisted (tenant): a lane with tasks whose tenant has no entry in the fair set, so
--     no claim serves it; found none, expected the virtual time the repair gives it: the least
--     in the set ("0" when empty), as a tenant that comes back gets (served in the next claim)
--   fair_entry_empty (tenant): a fair entry whose lane has no task, found its virtual time;
--     the repair removes it (harmless: a claim drops it when it finds the lane empty, and
--     cancelling a lane's last task leaves one)
--   fair_member_without_data (the member): a lane member whose task data is gone (report only:
--     the claim drops it)
--   dependency_cycle (the least id of the cycle): waiting tasks that wait for each other, found
--     "a -> c -> b -> a" (each waits for the next, at most 10 shown); with fix each ends dead
--     with an error record {type = "DependencyCycle", message = "waits for itself: <found>"}
-- A key whose counts are repaired and that has parked tasks is made ready for the next claim
-- (as keys_release does when a lease ends), so its parked tasks are looked at again.
--
-- Why each call is bounded: the "keys" phase walks the key_state hash (HSCAN, COUNT batch),
-- then the parked set key by key (ZRANGEBYLEX to the next key: O(log N) per key), at most
-- `batch` keys a call; each key costs one HGET and one ZLEXCOUNT. A leased count can only be
-- checked against every lease at once (no index by key), so a call that meets a key with a
-- stored leased count counts the leases per key from the meta values once (ZRANGE + HMGET:
-- O(leases)), refused above the lease cap (a note then says the leased counts were not
-- checked). The first call checks every key that holds a lease (at most the lease cap); the
-- parked walk checks only keys without a state (the others came from the hash) and counts no
-- lease; a lane it meets costs one ZSCORE in the fair set (a queue that never used fairness
-- has no lane). "fair" walks the fair set by ZSCAN (COUNT batch, as HSCAN above: a small set
-- comes whole), one ZRANGEBYLEX per entry for a task in its lane: one ZSCAN of a missing key
-- on a queue that never used fairness. "waits" and "orphans" walk their sets by rank, `batch`
-- entries a call; "rate" is one call, refused (with a note) above the lease cap. So one call
-- costs O(batch log N + lease cap). Each call is atomic for what it looks at; between calls
-- the queue runs on, so a key may be looked at twice (the caller keeps one finding per what
-- and subject). "cycles" walks the waiting set by rank, `batch` tasks a call, and from each a
-- depth-first walk up its parents' after entries (each task once a call), at most edge cap
-- edges a call: a call that runs out goes on from the task it was at (a note says so when one
-- task's walk alone does).
-- @include batches
-- @include clock
-- @include dependencies
-- @include ended
-- @include epoch_ms
-- @include errors
-- @include events
-- @include key_state
-- @include levels
-- @include links
-- @include meta
-- @include rate
-- @include settings
-- @include stats
-- @include wake

local now = dueq_now(ARGV[1])
local phase, cursor, batch = ARGV[2], ARGV[3], tonumber(ARGV[4])
local fix = ARGV[5] == '1'
local lease_cap, edge_cap = tonumber(ARGV[6]), tonumber(ARGV[7])
local k_due, k_leased, k_tasks, k_meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local k_stats, k_rate, k_state, k_parked, k_wait = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local k_fair = KEYS[24]
local bk = links.batch_keys(KEYS[20], KEYS[21], KEYS[22], KEYS[23], due_levels(k_due), k_tasks,
  k_stats, KEYS[19])
local ak = links.after_keys(KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[17], bk)
local out = {'', 0, ''}

local function found(what, subject, was, wanted, fixed)
  local n = #out
  out[n + 1], out[n + 2], out[n + 3] = what, subject, was
  out[n + 4], out[n + 5] = wanted, fixed and 1 or 0
end

-- End a dependency cycle's tasks dead (their edges to each other go first, so the settle that
-- follows sees only their children outside the cycle: buried, or released with policy "r").
local function cycle_end(cycle, shown)
  local k_dead, k_errors = KEYS[13], KEYS[14]
  local record = cjson.encode({at = now, attempt = 0, type = 'DependencyCycle',
    message = 'waits for itself: ' .. shown})
  for _, id in ipairs(cycle) do links.after_drop(ak, id) end
  for _, id in ipairs(cycle) do
    redis.call('ZADD', k_dead, now, id)
    error_append(k_errors, id, record)
    outcome_events.note('dead', id, 0, redis.call('HGET', k_tasks, id) or nil, nil, record)
  end
  stat_incr(k_stats, 'dead', #cycle)
  links.tasks_ended(bk, ak, cycle, 'dead', now)
  publish_ended(KEYS[17], cycle)
end

-- How many parked members `key` has.
local function parked_count(key)
  return redis.call('ZLEXCOUNT', k_parked, '[' .. key .. '\0', '(' .. key .. '\1')
end

-- Check a lane ("\1<tenant>", met in the parked walk: it has tasks) against the fair set: a lane
-- whose tenant has no entry is never served; the repair adds it at the least virtual time in
-- the set, as include/fair.lua's fair.add does for a lane that joins.
local function check_lane(lane)
  local tenant = string.sub(lane, 2)
  if redis.call('ZSCORE', k_fair, tenant) then return end
  local start = redis.call('ZRANGE', k_fair, 0, 0, 'WITHSCORES')[2] or '0'
  found('fair_lane_unlisted', tenant, false, start, fix)
  if fix then redis.call('ZADD', k_fair, 'NX', start, tenant) end
end

-- The leases per key, from the meta values ("|<key>"), or nil when there are more than the cap
-- (counted once per call, when a key first needs it).
local counted, counts_cache = false, nil
local function lease_counts()
  if counted then return counts_cache end
  counted = true
  local n = redis.call('ZCARD', k_leased)
  if n > lease_cap then
    out[3] = 'leased counts per key not checked: ' .. n .. ' leases, more than the cap of ' ..
      lease_cap
    return nil
  end
  local counts = {}
  local ids = redis.call('ZRANGE', k_leased, 0, -1)
  for i = 1, #ids, 1000 do
    local metas = redis.call('HMGET', k_meta, unpack(ids, i, math.min(i + 999, #ids)))
    for j = 1, #metas do
      local key = select(6, meta_parse(metas[j] or nil))
      if key then counts[key] = (counts[key] or 0) + 1 end
    end
  end
  counts_cache = counts
  return counts
end

-- Check one key's state against its parked members and against the leases: always when
-- `leases` is 'all', when its stored leased count is not 0 with 'stored' (a key that holds a
-- lease but has a stored count of 0 is found by the phase's first call, which checks every key
-- that holds a lease with 'all'), never with false.
local function check_key(key, leases)
  local raw = redis.call('HGET', k_state, key)
  local leased, mark, parked = key_state_parse(raw or nil)
  local readable = not raw or string.match(raw, '^%d+|[%d.]*|%d+$') ~= nil
  local counts = (leases == 'all' or leases and (leased ~= 0 or not readable)) and
    lease_counts() or nil
  local want_leased = counts and (counts[key] or 0) or (readable and leased or 0)
  local want_parked = parked_count(key)
  local wanted = key_state_value(want_leased, mark, want_parked, now)
  local wrong = false
  if not readable then
    found('key_state_unreadable', key, raw, wanted or false, fix)
    wrong = true
  else
    if leased ~= want_leased then
      found('key_leased', key, leased, want_leased, fix)
      wrong = true
    end
    if parked ~= want_parked then
      found('key_parked', key, parked, want_parked, fix)
      wrong = true
    end
  end
  if wrong and fix then
    key_state_write(k_state, {[key] = wanted or false})
    if want_parked > 0 then redis.call('ZADD', k_wait, 'LT', now, key) end
  end
end

if phase == 'keys' then
  local looked = 0
  if cursor == '' then  -- first call: every key that holds a lease
    for key in pairs(lease_counts() or {}) do
      check_key(key, 'all')
      looked = looked + 1
    end
    cursor = 's0'
  end
  if string.sub(cursor, 1, 1) == 's' then  -- the key_state hash, by HSCAN
    local scan = redis.call('HSCAN', k_state, string.sub(cursor, 2), 'COUNT', batch)
    local fields = scan[2]
    for i = 1, #fields, 2 do check_key(fields[i], 'stored') end
    looked = looked + #fields / 2
    out[1] = scan[1] == '0' and 'p' or 's' .. scan[1]
  else  -- the parked set, key by key ("p<last key looked at>"): keys without a state (the
    -- others were checked from the key_state hash)
    local last = string.sub(cursor, 2)
    local from = last == '' and '-' or '(' .. last .. '\1'
    out[1] = ''
    for _ = 1, batch do
      local member = redis.call('ZRANGEBYLEX', k_parked, from, '+', 'LIMIT', 0, 1)[1]
      if not member then break end
      looked = looked + 1
      local nul = string.find(member, '\0', 1, true)
      if nul then
        local key = string.sub(member, 1, nul - 1)
        -- (a fair queue's lane, "\1<tenant>", has no key state: include/fair.lua)
        if string.byte(key, 1) == 1 then
          check_lane(key)
        elseif redis.call('HEXISTS', k_state, key) == 0 then
          check_key(key, false)
        end
        from = '(' .. key .. '\1'
        out[1] = 'p' .. key
      else
        found('parked_unreadable', member, false, false, false)
        from = '(' .. member
        out[1] = 'p' .. member
      end
    end
    if looked < batch then out[1] = '' end
  end
  out[2] = looked
elseif phase == 'waits' then  -- "<rank>"
  local offset = tonumber(cursor) or 0
  local entries = redis.call('ZRANGE', k_wait, offset, offset + batch - 1, 'WITHSCORES')
  local removed = 0
  for i = 1, #entries, 2 do
    local key = entries[i]
    if parked_count(key) == 0 then
      found('key_wait_stale', key, clamp_ms(entries[i + 1]), false, fix)
      if fix then
        redis.call('ZREM', k_wait, key)
        removed = removed + 1
      end
    end
  end
  out[2] = #entries / 2
  if #entries / 2 == batch then out[1] = ms(offset + batch - removed) end
elseif phase == 'fair' then  -- "<ZSCAN cursor>"
  local scan = redis.call('ZSCAN', k_fair, cursor == '' and '0' or cursor, 'COUNT', batch)
  local entries = scan[2]
  for i = 1, #entries, 2 do
    local prefix = '\1' .. entries[i]
    local lane = redis.call('ZRANGEBYLEX', k_parked, '[' .. prefix .. '\0', '(' .. prefix .. '\1',
      'LIMIT', 0, 1)
    if #lane == 0 then
      found('fair_entry_empty', entries[i], entries[i + 1], false, fix)
      if fix then redis.call('ZREM', k_fair, entries[i]) end
    end
  end
  out[2] = #entries / 2
  if scan[1] ~= '0' then out[1] = scan[1] end
elseif phase == 'rate' then
  if redis.call('EXISTS', k_rate) == 1 then
    local n = redis.call('ZCARD', k_rate)
    if n > lease_cap then
      out[3] = 'rate_in_window not checked: ' .. n .. ' rate entries, more than the cap of ' ..
        lease_cap
    else
      local sum = 0
      for _, member in ipairs(redis.call('ZRANGE', k_rate, 0, -1)) do
        sum = sum + rate_entry_count(member)
      end
      local stored = redis.call('HGET', k_stats, 'rate_in_window')
      if tonumber(stored) ~= sum then
        found('rate_in_window', 'rate_in_window', tonumber(stored) or stored or false, sum, fix)
        if fix then redis.call('HSET', k_stats, 'rate_in_window', sum) end
      end
      out[2] = n
    end
  end
elseif phase == 'orphans' then  -- "<source>|<rank>": 1 leased, 2..11 due levels 0..9, 12 parked
  local levels = due_levels(k_due)
  local source, offset = string.match(cursor, '^(%d+)|(%d+)$')
  source, offset = tonumber(source) or 1, tonumber(offset) or 0
  local left = batch
  while left > 0 and source <= 12 do
    local k_set = source == 1 and k_leased or source == 12 and k_parked or levels[source - 2]
    local members = redis.call('ZRANGE', k_set, offset, offset + left - 1)
    local what = source == 1 and 'leased_without_data' or source == 12 and
      'parked_without_data' or 'due_without_data'
    for _, member in ipairs(members) do
      local id, subject = member, nil
      if source == 12 then
        local nul = string.find(member, '\0', 1, true)
        id = nul and string.sub(member, nul + 17) or ''
        if string.byte(member, 1) == 1 then subject = member end  -- a lane's (fair.lua)
      end
      if id ~= '' and redis.call('HEXISTS', k_tasks, id) == 0 then
        if subject then
          found('fair_member_without_data', subject, false, false, false)
        else
          found(what, id, false, false, false)
        end
      end
    end
    left = left - #members
    if left > 0 then
      source, offset = source + 1, 0
    else
      offset = offset + #members
    end
  end
  out[2] = batch - left
  if source <= 12 then out[1] = source .. '|' .. offset end
elseif phase == 'cycles' then  -- "<rank>" in the waiting set
  local offset = tonumber(cursor) or 0
  local starts = redis.call('ZRANGE', KEYS[10], offset, offset + batch - 1)
  local walked, mark = 0, {}  -- id -> 1 while on the walk's path, 2 once its walk is done
  local looked = 0
  for n, start in ipairs(starts) do
    if walked >= edge_cap then  -- out of edges: the next call goes on from this task
      out[1] = ms(offset + n - 1)
      break
    end
    looked = n
    if not mark[start] then
      mark[start] = 1
      local path = {{start, links.after_parents_of(ak, start), 0}}  -- id, parents, next
      while #path > 0 do
        local top = path[#path]
        top[3] = top[3] + 1
        local parent = top[2][top[3]]
        if parent == nil then
          mark[top[1]] = 2
          path[#path] = nil
        elseif walked >= edge_cap then
          if n == 1 then
            out[3] = 'dependency cycles not looked for past ' .. edge_cap .. ' edges above ' ..
              'waiting task ' .. start
          else
            out[1] = ms(offset + n - 1)
          end
          break
        else
          walked = walked + 1
          if mark[parent] == 1 then  -- back on the path: a cycle, from parent to top
            local cycle, least = {}, 1
            for i = #path, 1, -1 do
              table.insert(cycle, 1, path[i][1])
              if path[i][1] == parent then break end
            end
            for i = 2, #cycle do if cycle[i] < cycle[least] then least = i end end
            local shown = {}
            for i = 0, math.min(#cycle, 10) - 1 do
              shown[#shown + 1] = cycle[(least - 1 + i) % #cycle + 1]
            end
            shown[#shown + 1] = #cycle > 10 and '...' or cycle[least]
            shown = table.concat(shown, ' -> ')
            found('dependency_cycle', cycle[least], shown, false, fix)
            if fix then
              cycle_end(cycle, shown)
              for _, id in ipairs(cycle) do mark[id] = 2 end  -- dead now: no longer on a path
            end
          elseif not mark[parent] then
            mark[parent] = 1
            path[#path + 1] = {parent, links.after_parents_of(ak, parent), 0}
          end
        end
      end
      if out[1] ~= '' or out[3] ~= '' then break end
    end
  end
  out[2] = looked
  if out[1] == '' and out[3] == '' and #starts == batch then out[1] = ms(offset + batch) end
  if fix then  -- the events of the tasks ended here
    history_use(KEYS[18], ARGV[1])
    local events_ms = settings_read(KEYS[15], k_stats, 'events_ms').events_ms
    outcome_events.flush(KEYS[16], events_ms, now, ARGV[1])
  end
end
return out
