-- records.lua (include): a schedule record's trailers (parents, and where a record ends).
-- @include links

-- Dependencies (docs/dependencies.md). A task scheduled with parents (a schedule.lua record
-- with flag 32) that are not all finished waits in the waiting ZSET (id -> its due ms), out of
-- every due set, with after: id -> "<parents not finished>|<policy>|<parents waited for,
-- joined by "\0">" (policy "f": a parent that ends dead, cancelled or expired ends it dead;
-- "r": it runs anyway), and one member "<parent>\0<child>" per edge in the children ZSET (all
-- scores 0, so one ZRANGEBYLEX finds a parent's children). The scripts that end a task call
-- after_settle: an acked parent counts down its children and releases those with none left
-- into their due set; a parent that ended otherwise sends its "f" children to dead (and their
-- children, in turn). No polling.

-- A record's parents ('>I4' count, then '>Hc0' each) from pos: the list and the next pos.
function links.after_unpack(blob, pos)
  local n
  n, pos = struct.unpack('>I4', blob, pos)
  local parents = {}
  for i = 1, n do parents[i], pos = struct.unpack('>Hc0', blob, pos) end
  return parents, pos
end

-- The position after a schedule record's trailers (max wait, batch, parents), given its flags
-- and the position after its envelope (spark_stage.lua stages whole records).
function links.record_end(blob, pos, flags)
  local _
  if flags % 8 >= 4 then pos = pos + 8 end
  if flags % 32 >= 16 then _, pos = struct.unpack('>Hc0', blob, pos) end
  if flags % 64 >= 32 then _, pos = links.after_unpack(blob, pos) end
  return pos
end
