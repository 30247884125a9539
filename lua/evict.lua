-- evict (RedisGuard::force_release): KEYS[1] = record key; ARGV[1] = '1' to delete a COMPLETED
-- record too, '0' to keep it. Deletes whoever owns the record. Returns 1 when deleted, 0 when
-- there is no record, 2 when the record is COMPLETED and was kept.
-- Record layout (src/redis/record.h): the state is byte 2 ('I' or 'C').
local record = redis.call('GET', KEYS[1])
if not record then return 0 end
if string.sub(record, 2, 2) == 'C' and ARGV[1] ~= '1' then return 2 end
redis.call('DEL', KEYS[1])
return 1
