-- Prepare a key group for a savepoint import: fence every old writer and set
-- the committed position. State and timer contents are written afterwards by
-- the caller under the new epoch (which no worker holds).
-- KEYS[1] meta hash;  ARGV min_epoch, seq, position, watermark ('' = none)
local epoch = math.max((meta_number(redis.call('HGET', KEYS[1], 'epoch'), 'epoch') or 0) + 1,
                       tonumber(ARGV[1]))
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'epoch', epoch, 'token', '', 'owner', '', 'seq', ARGV[2],
           'position', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'watermark', ARGV[4])
end
return epoch
