-- velvetrope: buckets' levels now, without writing.
-- KEYS[i]: bucket hash; ARGV per key i, at 2(i-1)+1..: capacity, rate
-- Returns {level_1, reset_1, ...}; a missing bucket is full.
local now = clock_now()
local out = {}
for i = 1, #KEYS do
  local cap, rate = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local level = bucket_level(KEYS[i], cap, rate, now)
  out[#out + 1] = fmt(level)
  out[#out + 1] = fmt(math.max(0, (cap - level) / rate))
end
return out
