-- evict (RedisGuard::force_release): KEYS[1] = record key, KEYS[2] = its step journal; ARGV[1] =
-- '1' to delete a COMPLETED record too, '0' to keep it. Deletes whoever owns the record, and a
-- value that is not an idem record (another type, a string that is not a well-formed record).
-- With '1' (the side effect is to run again) the journal goes too, whatever it holds: its steps
-- would be replayed instead of run; with '0' it stays for the retry to skip the steps done.
-- Returns 1 when the record was deleted, 0 when there is no record, 2 when the record is
-- COMPLETED and was kept.
-- Record layout (src/guard/record.h): '1' 'C' owner(32 lowercase hex) <len>:<request id>
-- <len>:<fingerprint>, then 'B' and the response, or 'H' and its SHA-256 (64 lowercase hex).
local function completed(record)
  if not string.match(string.sub(record, 1, 34), '^1C' .. string.rep('[0-9a-f]', 32) .. '$') then
    return false
  end
  local pos = 35
  for _ = 1, 2 do
    local digits = string.match(record, '^%d+:', pos)
    if not digits then return false end
    pos = pos + #digits + tonumber(string.sub(digits, 1, -2))
    if pos > #record then return false end
  end
  local response = string.sub(record, pos, pos)
  if response == 'B' then return true end
  local sha256 = '^H' .. string.rep('[0-9a-f]', 64) .. '$'
  return string.match(string.sub(record, pos), sha256) ~= nil
end

if ARGV[1] == '1' then redis.call('DEL', KEYS[2]) end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then return 0 end
if kind == 'string' and ARGV[1] ~= '1' and completed(redis.call('GET', KEYS[1])) then return 2 end
redis.call('DEL', KEYS[1])
return 1
