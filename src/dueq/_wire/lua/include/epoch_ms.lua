-- epoch_ms.lua (include): scores read back as whole epoch ms (clamp_ms).

-- A score read back from a sorted set as whole epoch ms within 0 .. year 9999 (corrupted
-- scores such as 1.5, -1e20 or -inf are clamped, so the value can be formatted and parsed).
local MAX_MS = 253402300799999
local function clamp_ms(score)
  local n = tonumber(score)
  if not n or n ~= n or n < 0 then return 0 end
  if n > MAX_MS then return MAX_MS end
  return math.floor(n)
end
