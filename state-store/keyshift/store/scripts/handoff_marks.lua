-- Record the new owner's handoff marks (claimer side), if it still holds the fence.
-- KEYS[1] meta hash;  ARGV epoch, token, how it learned of the release, then name, unix
-- time pairs (stored as 'c:<name>', the way as 'c:via').
-- Returns 1, or 0 when the fence does not match (nothing written: a diagnostic only).
local m = redis.call('HMGET', KEYS[1], 'epoch', 'token')
if meta_number(m[1], 'epoch') ~= tonumber(ARGV[1]) or m[2] ~= ARGV[2] then
  return 0
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'c:via', ARGV[3]) end
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], 'c:' .. ARGV[i], ARGV[i + 1])
end
return 1
