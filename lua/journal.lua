-- journal: KEYS[1] = record key; KEYS[2] = its step journal (a hash: step name -> entry);
-- ARGV[1] = owner token; ARGV[2] = step name; ARGV[3] = journal entry; ARGV[4] = the journal's
-- TTL in ms. Writes the entry only while the record is IN_PROGRESS and owned by ARGV[1] (an
-- attempt whose lease ran out and was taken over is fenced out), then sets the journal's TTL.
-- Returns 1 when written, else 0.
local record = redis.call('GET', KEYS[1])
if not record or string.sub(record, 1, 34) ~= '1I' .. ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
