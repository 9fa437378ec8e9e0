-- Claim a key group: new epoch, new token, return where to resume.
-- KEYS[1] meta hash, KEYS[2] names set
-- ARGV owner, token, generation, now (the claimer's clock, unix seconds: only where the
-- store has no claim time; the server's clock stamps the claim), '1' to claim only if
-- released (nobody holds it, or the owner does) else ''. A claim refused because another
-- worker holds the key group registers the claimer as its successor (owner, token,
-- generation; the newest generation's claimer wins): the release hands the key group to
-- it (release.lua), and the claimer's next claim with the same token is answered as a
-- retry.
-- Returns {epoch, seq, position, watermark, names, previous owner, claimed at} (names:
-- the names set's members; previous owner '' when released, and in the answer to a retry),
-- {'STALE', stored_generation} or {'OWNED', owner}.
-- Also records the handoff pause: from the previous owner's release (or, for a
-- claim by force, its last commit) to this claim.
local m = redis.call('HMGET', KEYS[1], 'epoch', 'token', 'released_at', 'committed_at', 'seq',
                     'position', 'watermark', 'claimed_generation', 'released_generation',
                     'owner', 'claimed_at', 'next_generation')
local stored_epoch = meta_number(m[1], 'epoch')
local seq = meta_number(m[5], 'seq') or 0
local position = meta_number(m[6], 'position') or 0
meta_number(m[7], 'watermark')
if m[2] == ARGV[2] then
  -- this very claim was applied already and its reply lost: answer it again
  return {stored_epoch, seq, position, m[7], redis.call('SMEMBERS', KEYS[2]), '',
          m[11] or ARGV[4]}
end
if not m[1] and redis.call('EXISTS', KEYS[2]) == 1 then
  -- state without metadata (deleted, or evicted by a maxmemory policy): a claim would
  -- restart the key group from position 0 on top of that state and count it twice
  error({err = 'KSCORRUPT the metadata is missing while the key group has state'})
end
local latest = math.max(meta_number(m[8], 'claimed_generation') or 0,
                        meta_number(m[9], 'released_generation') or 0)
if tonumber(ARGV[3]) < latest then
  return {'STALE', latest}  -- a claimer still on an older assignment
end
local previous = m[10] or ''
if ARGV[5] == '1' and previous ~= '' and previous ~= ARGV[1] then
  -- not released yet: the claimer waits for the release, which hands it the key group
  local waiting = meta_number(m[12], 'next_generation')
  if not waiting or tonumber(ARGV[3]) >= waiting then
    redis.call('HSET', KEYS[1], 'next_owner', ARGV[1], 'next_token', ARGV[2],
               'next_generation', ARGV[3])
  end
  return {'OWNED', previous}
end
local since = m[4]
if m[2] == '' then since = m[3] end
return apply_claim(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], since, stored_epoch, seq,
                   position, m[7], previous)
