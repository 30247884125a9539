-- evict (RedisGuard::force_release): KEYS[1] = record key; ARGV[1] = '1' to delete a COMPLETED
-- record too, '0' to keep it. Deletes whoever owns the record, and a value of another type
-- (not an idem record: a hash, a list, ...). Returns 1 when deleted, 0 when there is no record,
-- 2 when the record is COMPLETED and was kept.
-- Record layout (src/guard/record.h): the state is byte 2 ('I' or 'C').
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then return 0 end
if kind == 'string' then
  local record = redis.call('GET', KEYS[1])
  if string.sub(record, 1, 2) == '1C' and ARGV[1] ~= '1' then return 2 end
end
redis.call('DEL', KEYS[1])
return 1
