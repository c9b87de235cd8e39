-- velvetrope: reserve every claim or none.
-- KEYS[1..n]: buckets; KEYS[n+1]: the job's hold
-- ARGV: per claim i, at 4(i-1)+1..4i: amount, capacity, rate, floor;
--       then ARGV[4n+1]: ttl slack ms, ARGV[4n+2]: hold ttl s
-- Returns as reserve_claims (common.lua).
local n = #KEYS - 1
return reserve_claims(0, n, 0, tonumber(ARGV[4 * n + 1]), KEYS[n + 1],
  ARGV[4 * n + 2], clock_now())
