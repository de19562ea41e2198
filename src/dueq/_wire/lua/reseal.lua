-- reseal.lua: key rotation (dueq rotate-key, _flows/rotate.py): replace stored envelopes
-- (tasks), finished records (results), error histories, step logs and cron definitions by
-- their payloads and values sealed with another key, each only if it is still byte for byte
-- the value the caller read and re-sealed. A task acked, cancelled, rescheduled with a new
-- payload or replaced meanwhile (its value gone or another) is skipped, never written back:
-- rotation never revives or clobbers a change. Only the sealed bytes of a re-sealed value
-- change (heads, name/trace lines and the JSON around a sealed value stay the same bytes),
-- so nothing the other scripts read of it changes. Writes nothing else: no state, score,
-- counter or lease moves.
--
-- KEYS[1] tasks    HASH id -> envelope
-- KEYS[2] results  HASH id -> finished record ('<header JSON>\n<envelope>', include/results.lua)
-- KEYS[3] errors   HASH id -> JSON list of error records (sealed messages: errors=True)
-- KEYS[4] steps    HASH id -> a durable task's step log (sealed step results), and more
-- KEYS[5] cron     HASH name -> definition (JSON, its payload a sealed value)
-- ARGV[1], ARGV[2], ... groups of four: where ("t" tasks, "r" results, "e" errors, "s"
--         steps, "c" cron), the field (an id, a steps field, a cron definition's name), the
--         SHA-1 (hex, as redis.sha1hex gives it) of the value read, the value to write in
--         its place
-- Returns a string of one character per group, in order: 'w' written, 's' skipped (the
--         value is gone or is not the one read)

local hashes = {t = KEYS[1], r = KEYS[2], e = KEYS[3], s = KEYS[4], c = KEYS[5]}
local written = {}
for i = 1, #ARGV, 4 do
  local key = hashes[ARGV[i]] or KEYS[1]
  local id = ARGV[i + 1]
  local current = redis.call('HGET', key, id)
  if current and redis.sha1hex(current) == ARGV[i + 2] then
    redis.call('HSET', key, id, ARGV[i + 3])
    written[#written + 1] = 'w'
  else
    written[#written + 1] = 's'
  end
end
return table.concat(written)
