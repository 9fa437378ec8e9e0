-- Apply one checkpoint of a key group atomically, if the fence matches.
-- KEYS[1] meta hash, KEYS[2] names set, KEYS[3..] state hashes (an entry state's followed
-- by its index) then timer sets
-- ARGV[1] epoch  ARGV[2] token  ARGV[3] seq  ARGV[4] position
-- ARGV[5] watermark ('' keeps the stored one)  ARGV[6] number of state hashes
-- ARGV[7] number of timer sets  ARGV[8] now (unix seconds)  ARGV[9] commit id (random,
-- drawn once per commit and sent again by its retries)
-- then per state hash:  name, entries (1: an entry state), puts, deletes; puts is one msgpack
--   array {k1, v1, k2, v2, ...} and deletes one {d1, d2, ...} (raw strings; '' for none)
-- then per timer set:   name, nadds, nremoves, score1, member1, ..., r1, ...
-- Returns {'OK', next_seq, replayed} or {'FENCED', reason, stored_epoch, stored_seq}.
local m = redis.call('HMGET', KEYS[1], 'epoch', 'token', 'seq', 'commit', 'released_token',
                     'released_seq', 'released_commit')
local epoch = meta_number(m[1], 'epoch') or 0
local seq = meta_number(m[3], 'seq') or 0
local want_seq = tonumber(ARGV[3])
if m[5] == ARGV[2] and m[7] == ARGV[9] then
  -- this very commit was applied, then its release (sent with it), and the key group may
  -- be another's since (the release hands it to a waiting successor): a retry
  return {'OK', meta_number(m[6], 'released_seq'), 1}
end
-- Same epoch, sequence one ahead, same commit id: this very commit was applied already
-- and its reply was lost; the client retried (the token may be gone by then: a
-- handoff's last commit carries its release, which clears it). Another commit with this
-- sequence (the writer gave up on a lost reply and went on) is fenced: answering it
-- "replayed" would acknowledge updates that were never applied.
if epoch == tonumber(ARGV[1]) and seq == want_seq + 1 and m[4] == ARGV[9] then
  return {'OK', seq, 1}
end
if epoch ~= tonumber(ARGV[1]) or m[2] ~= ARGV[2] then
  return {'FENCED', 'epoch', epoch, seq}
end
if seq ~= want_seq then
  return {'FENCED', 'sequence', epoch, seq}
end

local CHUNK = 1000
-- cmd key values[first], values[first + 1], ..., values[first + count * stride - 1], in
-- calls of at most CHUNK items (Lua's unpack has a stack limit)
local function apply(cmd, key, values, first, count, stride)
  local i = first
  local last = first + count * stride - 1
  while i <= last do
    local j = math.min(i + CHUNK * stride - 1, last)
    redis.call(cmd, key, unpack(values, i, j))
    i = j + 1
  end
end

-- an entry state's index: ZADD 0 (fields of the puts) / ZREM (deleted fields)
local function index(key, values, count)
  local i = 1
  local last = 2 * count - 1
  while i <= last do
    local j = math.min(i + CHUNK * 2 - 1, last)
    local members = {}
    for n = i, j, 2 do
      members[#members + 1] = 0
      members[#members + 1] = values[n]
    end
    redis.call('ZADD', key, unpack(members))
    i = j + 1
  end
end

local function unpacked(packed)
  if packed == '' then return {} end
  return cmsgpack.unpack(packed)
end

local arg = 10
local key = 3
for _ = 1, tonumber(ARGV[6]) do
  local name, entries = ARGV[arg], ARGV[arg + 1] == '1'
  local puts, dels = unpacked(ARGV[arg + 2]), unpacked(ARGV[arg + 3])
  local nput, ndel = #puts / 2, #dels
  arg = arg + 4
  if nput > 0 then
    apply('HSET', KEYS[key], puts, 1, nput, 2)
    if entries then index(KEYS[key + 1], puts, nput) end
  end
  if ndel > 0 then
    apply('HDEL', KEYS[key], dels, 1, ndel, 1)
    if entries then apply('ZREM', KEYS[key + 1], dels, 1, ndel, 1) end
  end
  redis.call('SADD', KEYS[2], 's:' .. name)
  key = key + 1
  if entries then
    redis.call('SADD', KEYS[2], 'e:' .. name)
    key = key + 1
  end
end
for _ = 1, tonumber(ARGV[7]) do
  local name, nadd, nrem = ARGV[arg], tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2])
  arg = arg + 3
  if nadd > 0 then apply('ZADD', KEYS[key], ARGV, arg, nadd, 2) end
  arg = arg + 2 * nadd
  if nrem > 0 then apply('ZREM', KEYS[key], ARGV, arg, nrem, 1) end
  arg = arg + nrem
  redis.call('SADD', KEYS[2], 't:' .. name)
  key = key + 1
end

redis.call('HSET', KEYS[1], 'seq', want_seq + 1, 'position', ARGV[4], 'committed_at', ARGV[8],
           'commit', ARGV[9])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'watermark', ARGV[5])
end
return {'OK', want_seq + 1, 0}
