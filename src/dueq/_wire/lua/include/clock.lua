-- clock.lua (include): the queue clock and whole ms as text.
-- ARGV[1] of every script is the queue clock: epoch ms, or "" for the server's TIME.

-- The queue clock in epoch ms, and the microseconds past that ms (0 for an injected clock).
local function dueq_now_us(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg), 0 end
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(us / 1000), us % 1000
end

local function dueq_now(arg)
  local now = dueq_now_us(arg)
  return now
end

local function ms(n) return string.format('%d', n) end
