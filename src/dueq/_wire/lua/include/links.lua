-- links.lua (include): links, the table of the batch and dependency helpers.

-- The batch helpers (batches.lua) and the dependency helpers (records.lua,
-- dependencies.lua, ended.lua) are fields of one table, links.
local links = {}
