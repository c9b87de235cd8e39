-- velvetrope: buckets' levels now, without writing.
-- KEYS[i]: bucket hash; ARGV per key i, at 2(i-1)+1..: capacity, rate
-- Returns each level as out_exact's pair (common.lua); a missing bucket is full.
local now = clock_now()
local out = {}
for i = 1, #KEYS do
  local cap, rate = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  out_exact(out, bucket_level(KEYS[i], cap, rate, now))
end
return out
