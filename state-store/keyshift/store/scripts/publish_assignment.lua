-- Replace the assignment if the stored generation is the expected one.
-- KEYS[1] assignment hash;  ARGV expected_generation, new_generation, payload
-- Returns {'OK'} or {'STALE', stored_generation}.
local stored = tonumber(redis.call('HGET', KEYS[1], 'generation') or '0')
if stored == tonumber(ARGV[2]) and redis.call('HGET', KEYS[1], 'payload') == ARGV[3] then
  return {'OK'}  -- this very publication was applied already: a retried request
end
if stored ~= tonumber(ARGV[1]) then
  return {'STALE', stored}
end
redis.call('HSET', KEYS[1], 'generation', ARGV[2], 'payload', ARGV[3])
return {'OK'}
