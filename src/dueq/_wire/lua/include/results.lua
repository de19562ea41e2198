-- results.lua (include): finished records (keep_results).
-- @include clock
-- @include errors

-- Results (keep_results). With the setting keep_results_ms > 0, a task that ends by ack or
-- cancel leaves a record in the results HASH (id -> '<header JSON>\n<envelope>', the header
-- {"state":"done"|"cancelled","finished_ms":..,"attempt":..,"result":<JSON or null>,
-- "unstored":"<why>" when the handler's value could not be kept, "errors":[...] the failed
-- attempts' records when there were any, "steps":"<log>" a durable task's step log}) and its finished time in
-- the finished ZSET. Each script that writes a record drops the records older than the
-- retention, at most RESULTS_TRIM + written per call (and, once the setting is off, the
-- leftovers as if the retention were 0): no sweeper. Dead tasks stay in the dead set as ever.
-- The ids of tasks that ended (acked while results are kept, dead, cancelled) are published
-- on the ended channel, packed as struct '>Hc0' each, for q.wait.
local results_record, results_trim
do
  local RESULTS_TRIM = 1000

  function results_record(state, now, attempt, result, unstored, errors, steps)
    local head = '{"state":"' .. state .. '","finished_ms":' .. ms(now) .. ',"attempt":' ..
      attempt .. ',"result":' .. (result or 'null')
    if unstored then head = head .. ',"unstored":' .. cjson.encode(unstored) end
    if errors then  -- the error history as stored, when it is a JSON list (else left out)
      if type(errors_decode(errors)) == 'table' then head = head .. ',"errors":' .. errors end
    end
    -- a durable task's step log (include/step_log.lua), as a JSON string
    if steps then head = head .. ',"steps":' .. cjson.encode(steps) end
    return head .. '}'
  end

  function results_trim(k_results, k_finished, now, keep_ms, written)
    local upto = keep_ms > 0 and '(' .. ms(now - keep_ms) or '+inf'  -- off: drop every one
    local old = redis.call('ZRANGEBYSCORE', k_finished, '-inf', upto, 'LIMIT', 0,
      RESULTS_TRIM + written)
    if #old > 0 then
      for i = 1, #old, 1000 do
        local chunk = {unpack(old, i, math.min(i + 999, #old))}
        redis.call('HDEL', k_results, unpack(chunk))
        redis.call('ZREM', k_finished, unpack(chunk))
      end
    end
  end
end
