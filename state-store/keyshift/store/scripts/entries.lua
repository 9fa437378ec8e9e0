-- One page of an entry state's entries in a lexicographic range of their fields.
-- KEYS[1] the state's hash, KEYS[2] its index
-- ARGV[1] min, ARGV[2] max (ZRANGEBYLEX bounds), ARGV[3] count
-- Returns {field1, value1, field2, value2, ...}.
local fields = redis.call('ZRANGEBYLEX', KEYS[2], ARGV[1], ARGV[2], 'LIMIT', 0, ARGV[3])
if #fields == 0 then return {} end
local values = redis.call('HMGET', KEYS[1], unpack(fields))
local out = {}
for i, f in ipairs(fields) do
  if not values[i] then
    error({err = 'KSCORRUPT an entry in the index has no value in the state hash'})
  end
  out[#out + 1] = f
  out[#out + 1] = values[i]
end
return out
