-- fair.lua (include): fair claiming between tenants (configure(fairness="key"), claim.lua).
-- @include bulk
-- @include chunked
-- @include clock
-- @include epoch_ms
-- @include levels
-- @include meta
-- @include parked
-- @include run_scores

-- Fairness. With the queue's fairness setting "key", a claim shares its leases between
-- tenants (a task's fair_key, else its limit key, else the default tenant '') in weighted
-- fair queueing by virtual time: each tenant with due tasks has a lane, and the fair ZSET
-- holds lane -> virtual time. A claim serves the lanes of least virtual time; each task a
-- lane gives adds 1 / weight to its time (weight: the config field weight:<tenant>, 1 when
-- unset), so while they have due tasks a tenant of weight w gets w tasks for every one of a
-- tenant of weight 1, whatever their backlogs. A lane that runs dry leaves the set (an idle
-- tenant costs nothing), and a tenant that comes back starts at the least virtual time in the
-- set: it is served in the next claim, and its absence earned it no credit.
--
-- Virtual time rather than deficit round-robin: one ZRANGE finds the next lanes in O(log K)
-- for K tenants with due tasks, the order survives between claims in the ZSET's scores (no
-- round pointer to keep), and a claim of a batch of B serves at most B lanes.
--
-- A lane's tasks are due tasks moved out of the priority levels into the parked ZSET (the
-- set per-key limits park in) as members "\1<tenant>\0<9 - priority><due ms, 15 digits><id>"
-- ("\1" cannot start a key: keys hold no control characters), with their due ms and lane in
-- their meta value ("<attempt>||<due ms>|<first>|\1<tenant>"), so every script that finds a
-- parked task by id finds a laned one the same way (parked_member_of). Within a lane the
-- highest priority goes first, then the earliest due: priorities order a tenant's own tasks,
-- and the share of each tenant is the same at every priority.
--
-- For stats (stats.lua): the fair_due ZSET holds tenant -> tasks in its lane, and two ZSETs,
-- the claims of even and of odd minutes, hold tenant -> tasks given from its lane in that
-- minute, with the members "\0m" -> the minute and "\0n" -> every task given then (a claim in
-- a new minute empties the bucket of two minutes before: O(1) per claim, no sweeper).
--
-- A task scheduled due now goes to its lane as it is scheduled (include/schedule_records.lua);
-- a task that falls due later (a delay, a retry's backoff) reaches its lane in a claim
-- (fair.lane), earliest due first, at most LANE_BUDGET per claim: each task is moved once, and
-- a task that falls due behind a burst of tasks falling due together waits for the burst's move
-- (LANE_BUDGET per claim), not for its service.
local fair = {}
do
  fair.LANE_BUDGET = 2000
  local MAX_WEIGHT = 1000
  -- The most lanes one take serves, about: a take of `room` gives a lane up to
  -- ceil(room / TAKE_LANES) tasks at a turn (its quantum), so a claim of 100 looks at about 25
  -- lanes, not 100 (each lane served costs a ZRANGEBYLEX, the main cost of a claim that serves
  -- many tenants), while the shares over claims stay exact (a turn adds quantum / weight).
  local TAKE_LANES = 25
  -- A lane that gives this many tasks or more has them removed as one lex range (one
  -- ZREMRANGEBYLEX, no lookup per member); fewer go in the take's one ZREM.
  local RANGE_FROM = 8

  -- The tenant of a stored envelope's task: its fair key, else its limit key, else '' (the
  -- tasks without a key share one lane).
  function fair.tenant(envelope)
    local _, _, key, fair_key = task_options(envelope)
    return fair_key or key or ''
  end

  -- The lane member of a task of `tenant`.
  function fair.member(tenant, priority, due_ms, id)
    return parked_member('\1' .. tenant, priority, due_ms, id)
  end

  -- Add `deltas` (tenant -> a count to add, negative to take) to the scores of the ZSET
  -- `k_counts` in one ZMSCORE and one ZADD (not a ZINCRBY per tenant: a claim gives from up to
  -- its batch of lanes); a member whose score reaches 0 is removed when `drop_zero`.
  local function add_counts(k_counts, deltas, drop_zero)
    local names = {}
    for tenant, n in pairs(deltas) do
      if n ~= 0 then names[#names + 1] = tenant end
    end
    if #names == 0 then return end
    local set, drop = {}, {}
    for from = 1, #names, 4000 do
      local to = math.min(from + 3999, #names)
      local old = redis.call('ZMSCORE', k_counts, unpack(names, from, to))
      for i = from, to do
        local tenant = names[i]
        local n = (tonumber(old[i - from + 1]) or 0) + deltas[tenant]
        if drop_zero and n <= 0 then
          drop[#drop + 1] = tenant
        else
          set[#set + 1] = n
          set[#set + 1] = tenant
        end
      end
    end
    if #set > 0 then zadd_many(k_counts, set) end
    if #drop > 0 then call_chunked('ZREM', k_counts, drop) end
  end

  -- Add `deltas` (tenant -> tasks added, or taken when negative) to the lanes' counts; a
  -- tenant whose count reaches 0 leaves fair_due.
  function fair.count_due(k_due, deltas)
    add_counts(k_due, deltas, true)
  end

  -- Count `given` (tenant -> tasks given from its lane, `total` in all) in this minute's
  -- claims bucket (`k_claims`: the even and the odd minutes').
  local function count_claims(k_claims, now, given, total)
    local minute = math.floor(now / 60000)
    local k_bucket = k_claims[minute % 2 + 1]
    if tonumber(redis.call('ZSCORE', k_bucket, '\0m')) ~= minute then
      redis.call('DEL', k_bucket)
      redis.call('ZADD', k_bucket, minute, '\0m')
    end
    given['\0n'] = total
    add_counts(k_bucket, given, false)
    given['\0n'] = nil
    redis.call('PEXPIRE', k_bucket, 180000)
  end

  -- Add tasks to their lanes: `members` (score, member pairs, as fair.member makes them),
  -- `metas` (id, meta value pairs) and `counts` (tenant -> tasks added: new lanes join the
  -- fair set at its least virtual time). `k`: meta, parked, fair, due.
  function fair.add(k, members, metas, counts)
    local k_fair = k.fair
    local lanes = {}
    for tenant in pairs(counts) do lanes[#lanes + 1] = tenant end
    fair.count_due(k.due, counts)
    zadd_many(k.parked, members)
    if #metas > 0 then hset_many(k.meta, metas) end
    local head = redis.call('ZRANGE', k_fair, 0, 0, 'WITHSCORES')[2]
    local start = head and tonumber(head) or 0
    local joins = {}
    for i = 1, #lanes do
      joins[2 * i - 1], joins[2 * i] = start, lanes[i]
    end
    zadd_chunked(k_fair, 'NX', joins)
  end

  -- The meta value of a laned task.
  function fair.meta(attempt, due_ms, first, tenant)
    return attempt .. '||' .. ms(due_ms) .. '|' .. first .. '|\1' .. tenant
  end

  -- Move due tasks (at most `budget`, highest priority first, earliest due within a
  -- priority) from the levels into their tenants' lanes; new lanes join the fair set at its
  -- least virtual time. Returns how many moved. `k`: tasks, meta, parked, fair.
  function fair.lane(k, levels, budget, now, upper_used)
    local members, metas, n_members, n_metas = {}, {}, 0, 0
    local counts = {}
    local moved = 0
    for p = upper_used and 9 or 0, 0, -1 do
      local room = budget - moved
      if room <= 0 then break end
      local k_level = levels[p]
      local ids = redis.call('ZRANGEBYSCORE', k_level, '-inf', now, 'LIMIT', 0, room)
      local n = #ids
      if n > 0 then
        local scores = run_scores(k_level, ids)
        redis.call('ZREMRANGEBYRANK', k_level, 0, n - 1)
        local envelopes = hmget_chunked(k.tasks, ids)
        local meta_values = hmget_chunked(k.meta, ids)
        for i = 1, n do
          local id, envelope = ids[i], envelopes[i]
          local tenant = envelope and fair.tenant(envelope) or ''
          local due_ms = clamp_ms(scores[i])
          members[n_members + 1], members[n_members + 2] = 0, fair.member(tenant, p, due_ms, id)
          n_members = n_members + 2
          local attempt, _, _, first, readable = meta_parse(meta_values[i])
          -- an unreadable meta value is kept as it is: the claim that takes the task from
          -- its lane buries it (CorruptTask); a task without data is dropped there
          if envelope and readable then
            metas[n_metas + 1] = id
            metas[n_metas + 2] = fair.meta(attempt, due_ms, first, tenant)
            n_metas = n_metas + 2
          end
          counts[tenant] = (counts[tenant] or 0) + 1
        end
        moved = moved + n
      end
    end
    if moved > 0 then fair.add(k, members, metas, counts) end
    return moved
  end

  -- A weight:<tenant> setting as a number (1 when unset or unusable: configure refuses
  -- anything but 1 .. MAX_WEIGHT, so another value was written by hand).
  local function weight_of(raw)
    local w = raw and #raw <= 4 and string.match(raw, '^%d+$') and tonumber(raw)
    if not w or w < 1 or w > MAX_WEIGHT then return 1 end
    return w
  end

  -- Take up to `room` laned tasks in fair order and out of their lanes. Returns the ids,
  -- their due ms (as text, 15 digits), their priorities, how many, and whether lanes may hold more that this
  -- call left (a lane ran dry before its share, or the lanes read were served to the least
  -- virtual time of the lanes not read): the caller may call again for the rest of its room.
  -- `k`: parked, fair, config, due, claims. Every lane given from gets its new virtual time (or
  -- leaves the set when it ran dry) in one ZADD and one ZREM.
  function fair.take(k, room, now)
    local k_parked, k_fair, k_config = k.parked, k.fair, k.config
    local heads = redis.call('ZRANGE', k_fair, 0, room, 'WITHSCORES')
    local n_lanes = #heads / 2
    if n_lanes == 0 or room <= 0 then return {}, {}, {}, 0, false end
    local bound = nil  -- the least virtual time of the lanes not read
    if n_lanes > room then
      bound = tonumber(heads[2 * room + 2])
      n_lanes = room
    end
    local tenant, v, w, give, fields = {}, {}, {}, {}, {}
    for i = 1, n_lanes do
      tenant[i] = heads[2 * i - 1]
      v[i] = tonumber(heads[2 * i]) or 0
      give[i] = 0
      fields[i] = 'weight:' .. tenant[i]
    end
    local raws = redis.call('HMGET', k_config, unpack(fields))
    for i = 1, n_lanes do w[i] = weight_of(raws[i]) end
    -- each lane's tasks as fair_due counts them (a hint: a lane counted at less than 1 is
    -- given 1, so a count gone wrong never strands a lane; one that holds more keeps the rest
    -- for the next take)
    local k_due = k.due
    local counted = redis.call('ZMSCORE', k_due, unpack(tenant, 1, n_lanes))
    local size = {}
    for i = 1, n_lanes do size[i] = math.max(math.floor(tonumber(counted[i]) or 1), 1) end
    -- Share the room: turns to the lane of least virtual time (ties: the order read), each of
    -- up to a quantum of tasks, in a binary heap of lane indexes (read in time order, so
    -- already a heap); a lane given all it holds leaves the heap.
    local quantum = math.max(math.ceil(room / TAKE_LANES), 1)
    local heap, at, n_heap = {}, {}, n_lanes
    for i = 1, n_lanes do heap[i], at[i] = i, v[i] end
    local function before(a, b) return at[a] < at[b] or (at[a] == at[b] and a < b) end
    local function sift(pos)
      while true do
        local c = 2 * pos
        if c > n_heap then return end
        if c < n_heap and before(heap[c + 1], heap[c]) then c = c + 1 end
        if not before(heap[c], heap[pos]) then return end
        heap[pos], heap[c] = heap[c], heap[pos]
        pos = c
      end
    end
    local given, stopped = 0, false
    while given < room do
      local top = heap[1]
      if not top then
        stopped = bound ~= nil  -- every lane read is given all it holds: more lanes remain
        break
      end
      if bound and at[top] > bound then stopped = true break end
      local turn = math.min(quantum, size[top] - give[top], room - given)
      give[top] = give[top] + turn
      given = given + turn
      at[top] = at[top] + turn / w[top]
      if give[top] >= size[top] then
        heap[1] = heap[n_heap]
        heap[n_heap] = nil
        n_heap = n_heap - 1
      end
      sift(1)
    end
    local ids, dues, priorities, n = {}, {}, {}, 0
    local taken, n_taken, times, n_times, dry, given = {}, 0, {}, 0, {}, {}
    local short, n_given, ranges = false, 0, {}
    for i = 1, n_lanes do
      local want = give[i]
      if want > 0 then
        local prefix = '\1' .. tenant[i]
        local got = redis.call('ZRANGEBYLEX', k_parked, '[' .. prefix .. '\0',
          '(' .. prefix .. '\1', 'LIMIT', 0, want + 1)
        local used = math.min(#got, want)
        if used > 0 then
          given[tenant[i]] = used
          n_given = n_given + used
        end
        -- a member is the prefix, \0, the inverted priority digit, 15 digits of due ms and
        -- the id: read by position (three substrings, no pattern match per task); the due ms
        -- stays text, which the claim turns into a number once per distinct due time
        local at_digit = #prefix + 2
        for j = 1, used do
          local member = got[j]
          local inverted = string.byte(member, at_digit)
          if inverted and inverted >= 48 and inverted <= 57 and #member > at_digit + 15 then
            n = n + 1
            ids[n] = string.sub(member, at_digit + 16)
            dues[n] = string.sub(member, at_digit + 1, at_digit + 15)
            priorities[n] = 57 - inverted
          end  -- (an unreadable member is dropped with the rest: it names no task)
        end
        if used >= RANGE_FROM then  -- the lane's first `used` members, as one range
          ranges[#ranges + 1] = {'[' .. got[1], '[' .. got[used]}
        else  -- a few: with the other lanes' few, in one ZREM
          for j = 1, used do
            n_taken = n_taken + 1
            taken[n_taken] = got[j]
          end
        end
        if #got > want then
          times[n_times + 1], times[n_times + 2] = v[i] + used / w[i], tenant[i]
          n_times = n_times + 2
        else
          dry[#dry + 1] = tenant[i]
          if #got < want then short = true end
        end
      end
    end
    for _, range in ipairs(ranges) do
      redis.call('ZREMRANGEBYLEX', k_parked, range[1], range[2])
    end
    if n_taken > 0 then call_chunked('ZREM', k_parked, taken) end
    if n_given > 0 then
      count_claims(k.claims, now, given, n_given)
      for t, used in pairs(given) do given[t] = -used end
      fair.count_due(k.due, given)
    end
    if n_times > 0 then zadd_chunked(k_fair, 'XX', times) end
    if #dry > 0 then call_chunked('ZREM', k_fair, dry) end
    return ids, dues, priorities, n, short or stopped
  end

  -- With fairness turned off ("off": lanes may remain): move up to `budget` laned tasks back
  -- to their levels; when none remain, the fair set goes and the setting with it (the claim
  -- then costs what it did before fairness). Returns how many moved.
  function fair.unlane(k, levels, budget)
    local k_parked, k_fair, k_config, k_due = k.parked, k.fair, k.config, k.due
    local members = redis.call('ZRANGEBYLEX', k_parked, '[\1', '(\2', 'LIMIT', 0, budget)
    local by_level, counts = {}, {}
    for _, member in ipairs(members) do
      local zero = string.find(member, '\0', 2, true)
      local priority, due_ms, id = nil, nil, nil
      if zero then
        priority, due_ms, id = parked_parse(member, string.sub(member, 1, zero - 1))
        local tenant = string.sub(member, 2, zero - 1)
        counts[tenant] = (counts[tenant] or 0) - 1
      end
      if id then
        local list = by_level[priority] or {}
        list[#list + 1] = due_ms
        list[#list + 1] = id
        by_level[priority] = list
      end
    end
    for p, list in pairs(by_level) do zadd_many(levels[p], list) end
    if #members > 0 then call_chunked('ZREM', k_parked, members) end
    fair.count_due(k_due, counts)
    if #members < budget then
      redis.call('DEL', k_fair, k_due)
      redis.call('HDEL', k_config, 'fairness')
    end
    return #members
  end
end
