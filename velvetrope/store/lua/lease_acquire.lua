-- velvetrope: take one pool slot for a job, fleet-wide, as a lease that expires.
-- KEYS[1]: zset job id -> lease expiry (s); KEYS[2]: hash job id -> tokens, '_total' -> sum
-- ARGV: job id, tokens, max in flight, max tokens in flight (-1: none), ttl s
-- Expired leases are dropped first.  A pool with nothing in flight always grants one.
-- Returns {granted (1/0), in flight after, tokens in flight after}.
local now = clock_now()
local id, tokens = ARGV[1], tonumber(ARGV[2])
local max_n, max_tok, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if lease_forget(KEYS[1], KEYS[2], redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
end
local n = redis.call('ZCARD', KEYS[1])
local total = tonumber(redis.call('HGET', KEYS[2], '_total')) or 0
if redis.call('ZSCORE', KEYS[1], id) then
  redis.call('ZADD', KEYS[1], now + ttl, id)
  return {1, n, total}
end
if n > 0 and (n >= max_n or (max_tok >= 0 and total + tokens > max_tok)) then
  return {0, n, total}
end
redis.call('ZADD', KEYS[1], now + ttl, id)
redis.call('HSET', KEYS[2], id, tokens)
total = redis.call('HINCRBY', KEYS[2], '_total', tokens)
redis.call('EXPIRE', KEYS[1], math.ceil(ttl * 2))
redis.call('EXPIRE', KEYS[2], math.ceil(ttl * 2))
return {1, n + 1, total}
