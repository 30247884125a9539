-- release: KEYS[1] = record key; ARGV[1] = owner token. Compare-and-delete: deletes the record
-- only while it is IN_PROGRESS and owned by ARGV[1]. Returns 1 when deleted, else 0.
local record = redis.call('GET', KEYS[1])
if record and string.sub(record, 2, 34) == 'I' .. ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
