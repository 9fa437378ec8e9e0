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

-- Give the key group to owner/token at generation: a new epoch, the claim time from the
-- server's clock, the handoff pause since `since` (unix seconds, or nil), the previous
-- claimer's handoff marks ('c:') and any waiting successor cleared. Shared by claim.lua
-- and by release.lua's handover. Returns the claim's answer: {epoch, seq, position,
-- watermark, names, previous owner, claimed at} (names: the names set's members).
local function apply_claim(meta, names, owner, token, generation, since, stored_epoch, seq,
                           position, watermark, previous)
  local epoch = (stored_epoch or 0) + 1
  local time = redis.call('TIME')
  local now = string.format('%.6f', tonumber(time[1]) + tonumber(time[2]) / 1000000)
  redis.call('HSET', meta, 'epoch', epoch, 'token', token, 'owner', owner,
             'claimed_generation', generation, 'claimed_at', now)
  redis.call('HDEL', meta, 'next_owner', 'next_token', 'next_generation')
  local fields = redis.call('HKEYS', meta)
  for _, field in ipairs(fields) do
    if string.sub(field, 1, 2) == 'c:' then redis.call('HDEL', meta, field) end
  end
  if since and tonumber(since) then
    redis.call('HSET', meta, 'pause', tostring(tonumber(now) - tonumber(since)))
  else
    redis.call('HDEL', meta, 'pause')
  end
  return {epoch, seq, position, watermark, redis.call('SMEMBERS', names), previous, now}
end
