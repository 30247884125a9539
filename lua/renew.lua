-- renew: KEYS[1] = record key; ARGV[1] = owner token; ARGV[2] = new lease in ms. Sets the TTL
-- of an IN_PROGRESS record owned by ARGV[1] to ARGV[2]. Returns 1 when renewed, else 0.
local record = redis.call('GET', KEYS[1])
if record and string.sub(record, 2, 34) == 'I' .. ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
