-- Prepended to the key-group scripts (claim, commit, release, load_key_group).
-- A metadata field that is not a whole number is corrupt: the script stops with a
-- KSCORRUPT error that names the field, before it has written anything.
local function meta_number(value, field)
  if not value then
    return nil
  end
  local n = tonumber(value)
  if n == nil or n ~= n or n == math.huge or n == -math.huge or math.floor(n) ~= n then
    error({err = 'KSCORRUPT field ' .. field .. ' is not a whole number: '
                 .. string.format('%q', string.sub(value, 1, 40))})
  end
  return n
end
