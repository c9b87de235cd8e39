-- velvetrope: extend the leases of jobs still running; ids whose lease already expired
-- (and were dropped) are not re-created.
-- KEYS as lease_acquire.lua; ARGV[1]: ttl s, ARGV[2..]: job ids.  Returns how many renewed.
local ttl = tonumber(ARGV[1])
local expiry = lease_expiry(ttl, clock_now())
local renewed = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then  -- held (a renewal within the same ms
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])  -- changes no score, yet counts)
    renewed = renewed + 1
  end
end
redis.call('EXPIRE', KEYS[1], math.ceil(ttl * 2))
redis.call('EXPIRE', KEYS[2], math.ceil(ttl * 2))
return renewed
