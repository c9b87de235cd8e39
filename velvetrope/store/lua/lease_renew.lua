-- velvetrope: extend the leases of jobs still running.  A lease that is gone (expired while
-- this replica could not renew it, or lost with Redis's data) is taken again whatever the
-- pool's limits: its job is running, and the fleet must count it.
-- KEYS as lease_acquire.lua; ARGV[1]: ttl s, then pairs (job id, tokens; tokens < 0: none
-- recorded, the lease was taken without a token cap).  Returns how many were re-created.
local ttl = tonumber(ARGV[1])
local expiry = lease_expiry(ttl, clock_now())
local recreated = 0
local recorded = false
for i = 2, #ARGV - 1, 2 do
  local id = ARGV[i]
  if redis.call('ZADD', KEYS[1], expiry, id) == 1 then
    recreated = recreated + 1
    local tokens = tonumber(ARGV[i + 1])
    if tokens >= 0 and not redis.call('HGET', KEYS[2], id) then
      redis.call('HSET', KEYS[2], id, tokens)
      redis.call('HINCRBY', KEYS[2], '_total', tokens)
      recorded = true
    end
  end
end
redis.call('EXPIRE', KEYS[1], math.ceil(ttl * 2))
if recorded or redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('EXPIRE', KEYS[2], math.ceil(ttl * 2))
end
return recreated
