-- ended.lua (include): tasks_ended, what every script that ends tasks calls once.
-- @include batches
-- @include dependencies
-- @include links

-- What every script that ends tasks calls once: `ids` ended with `outcome` (acked, dead,
-- cancelled, expired). Their waiting children are released or buried (after_settle), and
-- they and any children buried are counted in their batches (batch_settle).
function links.tasks_ended(bk, ak, ids, outcome, now)
  local buried = links.after_settle(ak, ids, outcome == 'acked', outcome, now)
  links.batch_settle(bk, ids, outcome, now)
  links.batch_settle(bk, buried, 'dead', now)
end
