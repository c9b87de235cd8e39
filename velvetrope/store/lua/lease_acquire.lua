-- velvetrope: take one pool slot for a job, fleet-wide, as a lease that expires.
-- KEYS[1]: zset job id -> lease expiry (ms); KEYS[2]: hash job id -> tokens, '_total' -> sum
-- ARGV: job id, tokens, max in flight, max tokens in flight (-1: none), ttl s
-- Returns {granted (1/0), in flight after, tokens in flight after (-1 without a cap)}.
return lease_take(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), tonumber(ARGV[5]), clock_now())
