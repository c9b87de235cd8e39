-- velvetrope: a job ended: settle its claims (settle.lua) and give back its pool slot
-- (lease_release.lua) in one round trip (standalone Redis).
-- KEYS[1]: hold; KEYS[2..n+1]: buckets; KEYS[n+2], KEYS[n+3]: the pool's lease zset, hash
-- ARGV: settle.lua's 1+5n, then the job id
-- Returns {settled (1/0), leases released (0/1)}.
local n = #KEYS - 3
local settled = settle_claims(KEYS[1], 1, n, 1, tonumber(ARGV[1]), clock_now())
return {settled, lease_give(KEYS[n + 2], KEYS[n + 3], {ARGV[5 * n + 2]})}
