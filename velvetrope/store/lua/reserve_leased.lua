-- velvetrope: reserve every claim or none and, if granted, take the job's pool slot: one
-- round trip for a job that starts at once (standalone Redis; on a cluster the buckets and
-- the pool live in different slots, and the two steps are separate calls).
-- KEYS[1..n]: buckets; KEYS[n+1]: hold; KEYS[n+2], KEYS[n+3]: the pool's lease zset, hash
-- ARGV: reserve.lua's 4n+2, then job id, tokens, max in flight, max tokens (-1), lease ttl
-- Returns reserve_claims' reply followed by {granted, in flight, tokens} of the lease
-- ({0, -1, -1} when the reservation was denied: no lease was asked for).
local n = #KEYS - 3
local now = clock_now()
local out = reserve_claims(0, n, 0, tonumber(ARGV[4 * n + 1]), KEYS[n + 1],
  ARGV[4 * n + 2], now)
local a = 4 * n + 2
local lease = {0, -1, -1}
if out[1] == 1 then
  lease = lease_take(KEYS[n + 2], KEYS[n + 3], ARGV[a + 1], tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), now)
end
for _, v in ipairs(lease) do
  out[#out + 1] = v
end
return out
