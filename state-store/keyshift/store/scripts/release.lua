-- Release a key group at a generation, if the fence matches, and announce it.
-- KEYS[1] meta hash;  ARGV epoch, token, generation, now (unix seconds), the job's
-- release channel ('' on a cluster: the caller publishes), the key group's number, the
-- id of the commit that must be the last applied ('' for any: sent after that commit in
-- one request, the release applies only if it did), then the releaser's handoff marks as
-- name, unix time pairs (stored as 'r:<name>').
-- Returns {'OK', stored_seq}, {'FENCED', 'epoch', stored_epoch, stored_seq} or
-- {'UNCOMMITTED', stored_seq}: the caller compares stored_seq with its own, to see
-- commits the store lost before the release.
local m = redis.call('HMGET', KEYS[1], 'epoch', 'token', 'seq', 'released_generation', 'commit')
local epoch = meta_number(m[1], 'epoch') or 0
local seq = meta_number(m[3], 'seq') or 0
if epoch ~= tonumber(ARGV[1]) then
  return {'FENCED', 'epoch', epoch, seq}
end
if m[2] == '' and (meta_number(m[4], 'released_generation') or 0) >= tonumber(ARGV[3]) then
  return {'OK', seq}  -- released already: a retried request
end
if m[2] ~= ARGV[2] then
  return {'FENCED', 'epoch', epoch, seq}
end
if ARGV[7] ~= '' and m[5] ~= ARGV[7] then
  return {'UNCOMMITTED', seq}  -- the commit before it was not applied: nothing written
end
redis.call('HSET', KEYS[1], 'token', '', 'owner', '', 'released_generation', ARGV[3],
           'released_at', ARGV[4])
local fields = redis.call('HKEYS', KEYS[1])
for _, field in ipairs(fields) do
  if string.sub(field, 1, 2) == 'r:' then redis.call('HDEL', KEYS[1], field) end
end
for i = 8, #ARGV, 2 do
  redis.call('HSET', KEYS[1], 'r:' .. ARGV[i], ARGV[i + 1])
end
-- the waiting new owner learns of it at once; a lost message costs a poll. On a cluster
-- the job's channel may live on another node than KEYS[1] (a script touches one slot):
-- there the caller publishes once this returns
if ARGV[5] ~= '' then
  redis.call('SPUBLISH', ARGV[5], ARGV[6])
end
return {'OK', seq}
