-- complete: KEYS[1] = record key; ARGV[1] = owner token; ARGV[2] = encoded response field;
-- ARGV[3] = retention in ms. Only when the record is still IN_PROGRESS and ARGV[1] owns it:
-- state COMPLETED, response stored, request ID and fingerprint kept, TTL = retention.
-- Returns 1 when completed now, or when ARGV[1] had completed it already (a resend of this same
-- completion: nothing changes); 0 when there is no record or another owner's; -1 when the value
-- is not a well-formed record (left as it is).
-- Record layout (src/guard/record.h): '1' state(1) owner(32) <len>:<request id> <len>:<fp> response
local record = redis.call('GET', KEYS[1])
if not record or string.sub(record, 3, 34) ~= ARGV[1] then return 0 end
if string.sub(record, 1, 1) ~= '1' then return -1 end  -- the owner's record, damaged
local state = string.sub(record, 2, 2)
if state == 'C' then return 1 end
if state ~= 'I' then return -1 end
local pos = 35
for _ = 1, 2 do
  local colon = string.find(record, ':', pos, true)
  if not colon then return -1 end
  local digits = string.sub(record, pos, colon - 1)
  if not string.match(digits, '^%d+$') then return -1 end
  pos = colon + 1 + tonumber(digits)
  if pos > #record + 1 then return -1 end
end
if string.sub(record, pos) ~= '-' then return -1 end
redis.call('SET', KEYS[1], '1C' .. string.sub(record, 3, pos - 1) .. ARGV[2], 'PX', ARGV[3])
return 1
