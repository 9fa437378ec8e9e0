-- Release a key group at a generation, if the fence matches, and announce it. A successor
-- waiting for the release (registered by its refused claim, claim.lua) at this generation
-- or a newer one is handed the key group at once: the release claims it for the successor,
-- and the announcement carries the claim (a msgpack array: key group, owner, token, epoch,
-- seq, position, watermark or '', the names set's members, claimed at), so the new owner
-- starts without a round trip of its own. Otherwise the announcement is the key group's
-- number.
-- KEYS[1] meta hash, KEYS[2] names set;  ARGV epoch, token, generation, now (unix seconds), the job's
-- release channel ('' on a cluster: the caller publishes), the key group's number, the
-- id of the commit that must be the last applied ('' for any: sent after that commit in
-- one request, the release applies only if it did), then the releaser's handoff marks as
-- name, unix time pairs (stored as 'r:<name>').
-- Returns {'OK', stored_seq, announcement}, {'FENCED', 'epoch', stored_epoch, stored_seq} or
-- {'UNCOMMITTED', stored_seq}: the caller compares stored_seq with its own, to see
-- commits the store lost before the release.
local m = redis.call('HMGET', KEYS[1], 'epoch', 'token', 'seq', 'released_generation', 'commit',
                     'position', 'watermark', 'next_owner', 'next_token', 'next_generation',
                     'released_token', 'released_seq')
local epoch = meta_number(m[1], 'epoch') or 0
local seq = meta_number(m[3], 'seq') or 0
if m[11] == ARGV[2] and (meta_number(m[4], 'released_generation') or 0) >= tonumber(ARGV[3]) then
  -- this very release, retried after a lost reply (the key group may be another's since)
  return {'OK', meta_number(m[12], 'released_seq') or seq, ARGV[6]}
end
if epoch ~= tonumber(ARGV[1]) then
  return {'FENCED', 'epoch', epoch, seq}
end
if m[2] == '' and (meta_number(m[4], 'released_generation') or 0) >= tonumber(ARGV[3]) then
  return {'OK', seq, ARGV[6]}  -- released already: a retried request
end
if m[2] ~= ARGV[2] then
  return {'FENCED', 'epoch', epoch, seq}
end
if ARGV[7] ~= '' and m[5] ~= ARGV[7] then
  return {'UNCOMMITTED', seq}  -- the commit before it was not applied: nothing written
end
-- the releaser's token, its last commit and its sequence: how a retry is recognised
redis.call('HSET', KEYS[1], 'token', '', 'owner', '', 'released_generation', ARGV[3],
           'released_at', ARGV[4], 'released_token', ARGV[2], 'released_seq', seq,
           'released_commit', m[5] or '')
local fields = redis.call('HKEYS', KEYS[1])
for _, field in ipairs(fields) do
  if string.sub(field, 1, 2) == 'r:' then redis.call('HDEL', KEYS[1], field) end
end
for i = 8, #ARGV, 2 do
  redis.call('HSET', KEYS[1], 'r:' .. ARGV[i], ARGV[i + 1])
end
-- a successor of this generation or a newer one is handed the key group; an older one
-- waited on an assignment since replaced: it is forgotten
local announcement = ARGV[6]
local waiting = meta_number(m[10], 'next_generation')
if waiting and waiting >= tonumber(ARGV[3]) then
  local claim = apply_claim(KEYS[1], KEYS[2], m[8], m[9], m[10], ARGV[4], epoch, seq,
                            meta_number(m[6], 'position') or 0, m[7], '')
  announcement = cmsgpack.pack({ARGV[6], m[8], m[9], tostring(claim[1]), tostring(seq),
                                tostring(claim[3]), m[7] or '', claim[5], claim[7]})
elseif waiting then
  redis.call('HDEL', KEYS[1], 'next_owner', 'next_token', 'next_generation')
end
-- the waiting new owner learns of it at once; a lost message costs a poll. On a cluster
-- the job's channel may live on another node than KEYS[1] (a script touches one slot):
-- there the caller publishes once this returns
if ARGV[5] ~= '' then
  redis.call('SPUBLISH', ARGV[5], announcement)
end
return {'OK', seq, announcement}
