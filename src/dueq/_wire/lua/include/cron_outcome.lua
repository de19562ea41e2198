-- cron_outcome.lua (include): cron occurrence ids and their last outcomes (the cron_last hash).
-- @include clock
-- @include epoch_ms

-- Cron last outcomes: the cron_last HASH (keys.py) holds, per definition name, the outcome of
-- its last firing as JSON {"id", "outcome" ("acked", "retrying" or "dead"), "at" ms,
-- "error_type" (or null), "ok_at" ms of its last ack (or null)}. Scripts that settle a
-- delivery call cron_note for ids that start with "cron:" (callers test the first byte, 99,
-- so other tasks pay one string.byte). Only the occurrence of the latest slot counts (a late
-- retry of an older one only moves ok_at), only while the definition exists (so the hash
-- holds at most one field per definition; cron_remove drops it), and an unreadable value is
-- overwritten.
local cron_occurrence, cron_note, cron_failures
do
  local CRON_LABEL = '(%d%d%d%d%d%d%d%dT%d%d%d%d%d%dZ)'
  local CRON_HEX8 = string.rep('[0-9a-f]', 8)

  -- Name and slot label (UTC, so later labels sort later as text) of an occurrence id:
  -- "cron:<name>:<label>" or run_now's "cron:<name>:now:<label>:<8 hex>"; nil for other ids.
  function cron_occurrence(id)
    local name, label = string.match(id, '^cron:(.+):' .. CRON_LABEL .. '$')
    if name then return name, label end
    return string.match(id, '^cron:(.+):now:' .. CRON_LABEL .. ':' .. CRON_HEX8 .. '$')
  end

  -- "failures" counts consecutive dead occurrences in the order they end (an ack resets it), for
  -- the definition's pause_after_failures (cron_advance pauses it); "cancelled" is written by
  -- cron_advance for an occurrence that overlap "cancel_other" cancelled.
  function cron_note(k_cron, k_last, id, outcome, now, error_type)
    local name, label = cron_occurrence(id)
    if not name or redis.call('HEXISTS', k_cron, name) == 0 then return end
    local ok, old = pcall(cjson.decode, redis.call('HGET', k_last, name) or 'null')
    local ok_at = outcome == 'acked' and now or nil
    local failures = 0
    if outcome ~= 'acked' and ok and type(old) == 'table' and type(old.failures) == 'number' then
      failures = math.min(math.max(math.floor(old.failures), 0), 1000000)
    end
    if outcome == 'dead' then failures = failures + 1 end
    if ok and type(old) == 'table' and type(old.id) == 'string' and type(old.at) == 'number'
        and type(old.outcome) == 'string' then
      local old_ok = type(old.ok_at) == 'number' and clamp_ms(old.ok_at) or nil
      if old_ok and (not ok_at or old_ok > ok_at) then ok_at = old_ok end
      local _, old_label = cron_occurrence(old.id)
      if old_label and old_label > label then  -- a later firing's outcome stays
        if outcome ~= 'acked' and outcome ~= 'dead' then return end
        id, outcome, now, error_type = old.id, old.outcome, clamp_ms(old.at), old.error_type
      end
    end
    if type(error_type) ~= 'string' then error_type = nil end
    redis.call('HSET', k_last, name, '{"id":' .. cjson.encode(id) .. ',"outcome":' ..
      cjson.encode(outcome) .. ',"at":' .. ms(now) .. ',"error_type":' ..
      (error_type and cjson.encode(string.sub(error_type, 1, 200)) or 'null') ..
      ',"ok_at":' .. (ok_at and ms(ok_at) or 'null') ..
      (failures > 0 and ',"failures":' .. ms(failures) or '') .. '}')
  end

  -- Consecutive dead occurrences of a definition (cron_note's "failures"), 0 when unknown.
  function cron_failures(k_last, name)
    local ok, t = pcall(cjson.decode, redis.call('HGET', k_last, name) or '{}')
    if ok and type(t) == 'table' and type(t.failures) == 'number' then return t.failures end
    return 0
  end
end
