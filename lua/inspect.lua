-- inspect: KEYS[1] = record key. Reads the record without changing it: returns
-- {record, PTTL in ms (-1 when the key has no expiry)}, or nil when there is no record.
local record = redis.call('GET', KEYS[1])
if not record then return false end
return {record, redis.call('PTTL', KEYS[1])}
