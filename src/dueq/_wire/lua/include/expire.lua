-- expire.lua (include): tasks_expire, ending tasks as expired.
-- @include bulk
-- @include chunked
-- @include followups
-- @include meta
-- @include results
-- @include stats
-- @include steps
-- @include wake

-- End tasks that are not leased (out of their due sets already) as expired: a kept record
-- with keep_results, the counter, the ended channel, their data dropped, follow-ups started.
-- Callers note each id's "expired" outcome event (outcome_events.note, with the envelope and
-- attempt they already hold) and flush them with their other events.
-- k: {tasks, meta, errors, stats, results, finished, ended, debounce, wake (or nil), steps
-- (or nil: their durable state, dropped)}.
local function tasks_expire(k, levels, ids, now, keep_ms)
  if #ids == 0 then return end
  local k_tasks, k_meta, k_errors, k_results, k_finished = k.tasks, k.meta, k.errors, k.results,
    k.finished
  if keep_ms > 0 then
    local envelopes = hmget_chunked(k_tasks, ids)
    local metas = hmget_chunked(k_meta, ids)
    local errors = hmget_chunked(k_errors, ids)
    local records = {}
    for i, id in ipairs(ids) do
      records[#records + 1] = id
      records[#records + 1] = results_record('expired', now, meta_parse(metas[i]), nil, nil,
        errors[i] or nil) .. '\n' .. (envelopes[i] or '')
    end
    call_chunked('HSET', k_results, records)
    zadd_all(k_finished, now, ids)
  end
  results_trim(k_results, k_finished, now, keep_ms, #ids)
  call_chunked('HDEL', k_tasks, ids)
  call_chunked('HDEL', k_meta, ids)
  call_chunked('HDEL', k_errors, ids)
  steps_forget(k.steps, ids)
  stat_incr(k.stats, 'expired_tasks', #ids)
  publish_ended(k.ended, ids)
  followups_start(k, levels, ids, now)
end
