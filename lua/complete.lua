-- complete: KEYS[1] = record key; ARGV[1] = owner token; ARGV[2] = encoded response field;
-- ARGV[3] = retention in ms. Only when ARGV[1] owns the record: state COMPLETED, response
-- stored, request ID and fingerprint kept, TTL = retention. Returns 1, or 0 when not the owner.
-- Record layout (src/redis/record.h): '1' state(1) owner(32) <len>:<request id> <len>:<fp> response
local record = redis.call('GET', KEYS[1])
if not record or string.sub(record, 3, 34) ~= ARGV[1] then return 0 end
local pos = 35
for _ = 1, 2 do
  local colon = string.find(record, ':', pos, true)
  pos = colon + 1 + tonumber(string.sub(record, pos, colon - 1))
end
redis.call('SET', KEYS[1], '1C' .. string.sub(record, 3, pos - 1) .. ARGV[2], 'PX', ARGV[3])
return 1
