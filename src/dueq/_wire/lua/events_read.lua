-- events_read.lua: one consumer group member's read of new outcome events (XREADGROUP '>'
-- without BLOCK), after counting the events the group lost to the events retention, in one
-- atomic step, so that no trim falls between the count and the read.
--
-- The writing scripts trim entries older than the retention (include/events.lua). A
-- group whose last delivered id is older than the oldest entry kept lost every entry trimmed
-- since: Redis 7 counts them as entries-added - length - the group's entries-read (XINFO).
-- Redis itself would then read on from the oldest entry kept and add one to entries-read per
-- entry, so the group's lag would count the lost entries forever; XGROUP SETID ... ENTRIESREAD
-- moves its read counter past them (its last delivered id stays), so its lag is right again
-- and the next call counts only what is lost after this one.
--
-- KEYS[1] events  STREAM outcome events
-- KEYS[2] stats   HASH counter -> int (events_lost: events trimmed before a group settled them)
-- ARGV[1] group
-- ARGV[2] consumer (the member's name)
-- ARGV[3] most entries to read
-- ARGV[4] entries this member found trimmed while pending (delivered, not acked: the reader
--         acks them), counted in events_lost with those found here
-- Returns {lost, entries}: lost the entries trimmed before the group read them (0 for none;
--         -1 when the server cannot tell: Redis 6.2 has no entries-added); entries the
--         XREADGROUP reply (false for none). {0, false} when the stream or the group is gone
--         (the member's next XREADGROUP says so, and it makes the group again).
-- @include stats

local function field(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
  return nil
end

-- "<ms>-<seq>" as two numbers, compared in order
local function id_before(a, b)
  local a_ms, a_seq = string.match(a, '^(%d+)-(%d+)$')
  local b_ms, b_seq = string.match(b, '^(%d+)-(%d+)$')
  a_ms, b_ms = tonumber(a_ms), tonumber(b_ms)
  return a_ms < b_ms or (a_ms == b_ms and tonumber(a_seq) < tonumber(b_seq))
end

local stream, group = KEYS[1], ARGV[1]
local trimmed_pending = tonumber(ARGV[4]) or 0
if redis.call('EXISTS', stream) == 0 then return {0, false} end
local info = redis.call('XINFO', 'STREAM', stream)
local mine = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  if field(g, 'name') == group then mine = g end
end
if not mine then return {0, false} end

local lost = -1
local added, read = field(info, 'entries-added'), field(mine, 'entries-read')
local delivered = field(mine, 'last-delivered-id')
-- A group that never read has no valid read counter (XGROUP CREATE ... MKSTREAM makes it on
-- an empty stream): from 0-0 it read none. Past any other id Redis cannot tell.
if type(read) ~= 'number' and delivered == '0-0' then read = 0 end
if added then
  local length = field(info, 'length')
  local first = field(info, 'first-entry')
  local behind
  if length == 0 then
    behind = id_before(delivered, field(info, 'last-generated-id'))
  else
    behind = id_before(delivered, first[1])
  end
  lost = type(read) == 'number' and 0 or -1
  if behind and (type(read) ~= 'number' or added - length > read) then
    -- (an unknown counter is set too, so that what is lost after this is counted)
    if type(read) == 'number' then lost = added - length - read end
    redis.call('XGROUP', 'SETID', stream, group, delivered, 'ENTRIESREAD', added - length)
  end
end
local counted = math.max(lost, 0) + trimmed_pending
if counted > 0 then stat_incr(KEYS[2], 'events_lost', counted) end
local entries = redis.call('XREADGROUP', 'GROUP', group, ARGV[2], 'COUNT', tonumber(ARGV[3]),
  'STREAMS', stream, '>')
return {lost, entries}
