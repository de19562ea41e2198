-- lease_pairs.lua (include): the (id, lease token) pairs of ack, extend and release, and
-- their verdicts.
-- @include meta

-- The leases given as (id, lease token) pairs (ack, extend), packed as runs of consecutive
-- pairs under one token: the token ('>Hc0') and the run's count ('>I4'), then its ids ('>Hc0'
-- each). A repeated pair counts once. Returns the distinct ids and tokens, and for each pair as
-- given the index of its distinct pair (so a reply can say something about every pair, in the
-- caller's order). Pairs are told apart by id, and by "id|token" only for an id sent under two
-- tokens. A run's ids are read LEASE_IDS_STEP at a time with one struct.unpack (a call per id
-- costs more than the rest of the loop).
local leases_unpack
do
  local LEASE_IDS_STEP = 200
  local lease_ids_formats = {}  -- count -> '>' .. count times 'Hc0'
  function leases_unpack(blob)
    local ids, tokens, by_id, by_pair, positions = {}, {}, {}, nil, {}
    local n, k, pos, size, unpack_struct = 0, 0, 1, #blob, struct.unpack
    local got = {}
    while pos <= size do
      local token, count
      token, count, pos = unpack_struct('>Hc0I4', blob, pos)
      while count > 0 do
        local step = math.min(count, LEASE_IDS_STEP)
        local format = lease_ids_formats[step]
        if not format then
          format = '>' .. string.rep('Hc0', step)
          lease_ids_formats[step] = format
        end
        got = {unpack_struct(format, blob, pos)}
        pos = got[step + 1]
        count = count - step
        for g = 1, step do
          local id = got[g]
          local at = by_id[id]
          if at == nil then
            n = n + 1
            ids[n], tokens[n], by_id[id], at = id, token, n, n
          elseif tokens[at] ~= token then
            by_pair = by_pair or {}
            local pair = id .. '|' .. token
            at = by_pair[pair]
            if not at then
              n = n + 1
              ids[n], tokens[n], by_pair[pair], at = id, token, n, n
            end
          end
          k = k + 1
          positions[k] = at
        end
      end
    end
    return ids, tokens, positions
  end
end

-- Judge each distinct lease: 'h' held under its token at now, 'c' revoked by cancel.lua
-- (cancelled while leased: remembered in k_cancelled as "id|token"), 'l' lost (expired, taken
-- over, or the task is gone). One ZMSCORE and one HMGET for the lot (callers send <= 1000).
-- A first lease without a meta value is held when its deadline is the one its token names
-- (include/claims.lua).
-- Returns the held ids, the verdict of each distinct lease, the limit keys the held leases
-- are counted in, and the held ids that have a meta value.
local function judge_leases(k_leased, k_meta, k_cancelled, ids, tokens, now)
  local held, verdicts, keys = {}, {}, {}
  if #ids == 0 then return held, verdicts, keys, {} end
  -- When the earliest deadline in leased is after now, every lease is live, and a meta value
  -- whose token matches is a lease (only a lease's own claim writes its token into meta, or
  -- extend.lua and configure.lua the one of a first lease; whatever ends a lease clears the
  -- token or deletes the value): no deadline needs reading. Otherwise each
  -- one is read (ZMSCORE, whose reply formats a score per id: most of a lease check's cost).
  local deadlines = nil
  local earliest = redis.call('ZRANGE', k_leased, 0, 0, 'WITHSCORES')[2]
  if not earliest or tonumber(earliest) <= now then
    deadlines = redis.call('ZMSCORE', k_leased, unpack(ids))
  end
  -- (no meta hash: every lease is a first one, and no value needs asking for)
  local metas = redis.call('EXISTS', k_meta) == 1 and redis.call('HMGET', k_meta, unpack(ids))
    or {}
  local n_held, match = 0, string.match
  local with_meta = {}  -- the held ids that have a meta value (the rest have none to delete)
  -- A first lease has no meta value (claim.lua writes none): it is held when its deadline is
  -- the one its token names (include/claims.lua). When every lease is live, the ids still
  -- leased at a token's deadline D are read as one range (ZRANGEBYSCORE D D: ids, no score
  -- to format), when that range is at most twice the ids asked under that token (an ack of a
  -- whole claim: exactly them); otherwise those ids' deadlines are read (ZMSCORE, as above).
  local at_deadline = nil  -- token -> the set of its ids leased at its D (every lease live)
  local loose_held = {}  -- index -> held, for the first leases of the other tokens
  if deadlines == nil then
    local asked = nil  -- token -> ids without a meta value asked under it
    for i = 1, #ids do
      if not metas[i] then
        asked = asked or {}
        asked[tokens[i]] = (asked[tokens[i]] or 0) + 1
      end
    end
    if asked then
      at_deadline = {}
      local loose = nil  -- token -> D, for the tokens whose ids' deadlines are read
      for token, n in pairs(asked) do
        local d = match(token, '^(%d+)')
        if d and redis.call('ZCOUNT', k_leased, d, d) <= 2 * n then
          local set = {}
          for _, id in ipairs(redis.call('ZRANGEBYSCORE', k_leased, d, d)) do set[id] = true end
          at_deadline[token] = set
        else
          loose = loose or {}
          loose[token] = d and tonumber(d) or false
        end
      end
      if loose then
        local where, loose_ids = {}, {}
        for i = 1, #ids do
          if not metas[i] and loose[tokens[i]] ~= nil then
            where[#where + 1] = i
            loose_ids[#loose_ids + 1] = ids[i]
          end
        end
        local got = redis.call('ZMSCORE', k_leased, unpack(loose_ids))
        for k = 1, #where do
          local i = where[k]
          loose_held[i] = got[k] ~= false and tonumber(got[k]) == loose[tokens[i]]
        end
      end
    end
  end
  -- the deadline each distinct token names, and each distinct deadline text as a number
  local named, numbers = {}, {}
  -- whether a deadline (its text) is after now, read once per distinct text: the leases of
  -- one claim share their deadline, and tonumber's strtod costs more than the rest of a check
  local live = {}
  -- the last meta value read and its token and key: the first deliveries of one claim that
  -- share a due ms share one meta value (claim.lua makes it once), and an ack lists them next
  -- to each other, so their value is parsed once (the pattern match is about 4k Redis
  -- instructions; the comparison of two Lua strings, interned, is one of pointers)
  local last_v, last_token, last_key = nil, '', nil
  for i = 1, #ids do  -- not ipairs: its iterator is a C call per id
    local id, v = ids[i], metas[i]
    -- the token and key of its meta value, as meta_parse reads them ('' and nil when it is
    -- unreadable), inlined (a Lua call per id cost more than the rest of its check) and
    -- without making strings of the parts a lease check does not need. The attempt is read
    -- as a number (strtod: about 800 instructions) only when it has ten digits or more: nine
    -- always fit MAX_ATTEMPT.
    local token, key = '', nil
    if v and v == last_v then
      token, key = last_token, last_key
    elseif v then
      local a_end, t, d, d_end, f, rest = match(v, '^%d+()|([^|]*)|()%d*()|()%d*()')
      if a_end and d_end - d <= 16 and rest - f <= 16
          and (a_end <= 10 or tonumber(string.sub(v, 1, a_end - 1)) <= MAX_ATTEMPT) then
        if rest > #v then
          token = t
        elseif rest < #v and string.byte(v, rest) == 124 then  -- "|<key>", the key not empty
          token, key = t, string.sub(v, rest + 1)
        end
      end
      last_v, last_token, last_key = v, token, key
    end
    local deadline, after = deadlines and deadlines[i], deadlines == nil
    if deadline then
      after = live[deadline]
      if after == nil then
        after = tonumber(deadline) > now
        live[deadline] = after
      end
    end
    if not v and at_deadline then  -- a first lease, every lease live: leased at its D?
      local set = at_deadline[tokens[i]]
      if set then
        if set[id] then token = tokens[i] end
      elseif loose_held[i] then
        token = tokens[i]
      end
      after = true
    elseif not v and after then  -- a first lease: its deadline must be its token's
      local d = named[tokens[i]]
      if d == nil then
        d = tonumber(match(tokens[i], '^(%d+)')) or false
        named[tokens[i]] = d
      end
      local n = numbers[deadline]
      if n == nil then
        n = tonumber(deadline)
        numbers[deadline] = n
      end
      if d == n then token = tokens[i] end
    end
    if after and token ~= '' and token == tokens[i] then
      n_held = n_held + 1
      held[n_held] = id
      if key then keys[#keys + 1] = key end
      if v then with_meta[#with_meta + 1] = id end
      verdicts[i] = 'h'
    elseif redis.call('ZSCORE', k_cancelled, id .. '|' .. tokens[i]) then
      verdicts[i] = 'c'
    else
      verdicts[i] = 'l'
    end
  end
  return held, verdicts, keys, with_meta
end

-- One character per pair as given: its lease's verdict ('h', 'c' or 'l'). `n_held` is the
-- number of distinct leases held: when all are, every pair's verdict is 'h'.
local function verdict_string(verdicts, positions, n_held)
  if n_held and n_held == #verdicts then return string.rep('h', #positions) end
  local out = {}
  for k, at in ipairs(positions) do out[k] = verdicts[at] end
  return table.concat(out)
end
