-- Claim a key group: new epoch, new token, return where to resume.
-- KEYS[1] meta hash
-- ARGV owner, token, generation, now (unix seconds)
-- Also records the handoff pause: from the previous owner's release (or, for a
-- claim by force, its last commit) to this claim.
local m = redis.call('HMGET', KEYS[1], 'epoch', 'token', 'released_at', 'committed_at')
if m[2] == ARGV[2] then
  -- this very claim was applied already and its reply lost: answer it again
  local r = redis.call('HMGET', KEYS[1], 'seq', 'position', 'watermark')
  return {tonumber(m[1]), tonumber(r[1] or '0'), tonumber(r[2] or '0'), r[3]}
end
local epoch = tonumber(m[1] or '0') + 1
local since = m[4]
if m[2] == '' then since = m[3] end
redis.call('HSET', KEYS[1], 'epoch', epoch, 'token', ARGV[2], 'owner', ARGV[1],
           'claimed_generation', ARGV[3], 'claimed_at', ARGV[4])
if since then
  redis.call('HSET', KEYS[1], 'pause', tostring(tonumber(ARGV[4]) - tonumber(since)))
else
  redis.call('HDEL', KEYS[1], 'pause')
end
local r = redis.call('HMGET', KEYS[1], 'seq', 'position', 'watermark')
return {epoch, tonumber(r[1] or '0'), tonumber(r[2] or '0'), r[3]}
