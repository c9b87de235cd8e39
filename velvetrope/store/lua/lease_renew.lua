-- velvetrope: extend the leases of jobs still running; ids whose lease already expired
-- (and were dropped) are not re-created.
-- KEYS as lease_acquire.lua; ARGV[1]: ttl s, ARGV[2..]: job ids.  Returns how many renewed.
local now = clock_now()
local ttl = tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[i]) == 1 then
    renewed = renewed + 1
  end
end
redis.call('EXPIRE', KEYS[1], math.ceil(ttl * 2))
redis.call('EXPIRE', KEYS[2], math.ceil(ttl * 2))
return renewed
