-- Claim a key group: new epoch, new token, return where to resume.
-- KEYS[1] meta hash
-- ARGV owner, token, generation
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') + 1
redis.call('HSET', KEYS[1], 'epoch', epoch, 'token', ARGV[2], 'owner', ARGV[1],
           'claimed_generation', ARGV[3])
local m = redis.call('HMGET', KEYS[1], 'seq', 'position', 'watermark')
return {epoch, tonumber(m[1] or '0'), tonumber(m[2] or '0'), m[3]}
