-- claim: KEYS[1] = record key; ARGV[1] = the new IN_PROGRESS record; ARGV[2] = lease in ms.
-- Returns the existing record (a repeat; nothing changes), or nil after storing ARGV[1] with
-- the lease as TTL (the caller is first). Same answer as `SET key record NX PX lease GET`.
local existing = redis.call('GET', KEYS[1])
if existing then return existing end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
