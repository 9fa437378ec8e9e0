-- Release a key group at a generation, if the fence matches.
-- KEYS[1] meta hash;  ARGV epoch, token, generation, now (unix seconds)
-- Returns {'OK'} or {'FENCED', 'epoch', stored_epoch, stored_seq}.
local m = redis.call('HMGET', KEYS[1], 'epoch', 'token', 'seq', 'released_generation')
local epoch = tonumber(m[1] or '0')
local seq = tonumber(m[3] or '0')
if epoch ~= tonumber(ARGV[1]) then
  return {'FENCED', 'epoch', epoch, seq}
end
if m[2] == '' and tonumber(m[4] or '0') >= tonumber(ARGV[3]) then
  return {'OK'}  -- released already: a retried request
end
if m[2] ~= ARGV[2] then
  return {'FENCED', 'epoch', epoch, seq}
end
redis.call('HSET', KEYS[1], 'token', '', 'owner', '', 'released_generation', ARGV[3],
           'released_at', ARGV[4])
return {'OK'}
