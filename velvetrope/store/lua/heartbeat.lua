-- velvetrope: one replica says it is alive, with its queue depth.
-- KEYS[1]: zset replica -> last beat (s); KEYS[2]: hash replica -> queue depth
-- ARGV: replica id, ttl s (a replica silent this long is gone), queue depth
-- Returns {live replicas, summed queue depth of live replicas, 1 if this replica was live
-- here before this beat else 0 (a first beat, or Redis lost its data, or it fell silent)}.
local now = clock_now()
local ttl = tonumber(ARGV[2])
local last = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
local known = 0
if last and last > now - ttl then
  known = 1
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
for _, d in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl)) do
  redis.call('HDEL', KEYS[2], d)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('EXPIRE', KEYS[1], math.ceil(ttl * 4))
redis.call('EXPIRE', KEYS[2], math.ceil(ttl * 4))
local depth = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
  depth = depth + (tonumber(v) or 0)
end
return {redis.call('ZCARD', KEYS[1]), depth, known}
