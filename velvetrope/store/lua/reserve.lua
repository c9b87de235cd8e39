-- velvetrope: reserve every claim or none (the rules of velvetrope.core.bucket.MemoryBuckets).
-- KEYS[i], i <= n: bucket hash; KEYS[n+1]: the job's hold
-- ARGV: per claim i, at 4(i-1)+1..4i: amount, capacity, rate, floor;
--       then ARGV[4n+1]: ttl slack ms, ARGV[4n+2]: hold ttl s
-- A grant writes the hold (the job's reservation awaits settlement: see settle.lua).
-- Returns {1, level_1, reset_1, ...} (levels after the reservation) or
--         {0, wait_s, worst_index, level_1, reset_1, ...} (nothing written).
local now = clock_now()
local n = #KEYS - 1
local slack = tonumber(ARGV[4 * n + 1])
local levels = {}
local worst, worst_i = 0, 0
for i = 1, n do
  local b = 4 * (i - 1)
  local amount, cap, rate = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local level = bucket_level(KEYS[i], cap, rate, now)
  levels[i] = level
  local w = 0
  if amount > cap then
    w = math.huge
  elseif level < amount then
    w = (amount - level) / rate
  end
  if w > worst then
    worst, worst_i = w, i
  end
end
local out = {}
local granted = worst == 0
if granted then
  out[1] = 1
  redis.call('SET', KEYS[n + 1], '1', 'EX', tonumber(ARGV[4 * n + 2]))
else
  out[1] = 0
  out[2] = fmt(worst)
  out[3] = worst_i
end
for i = 1, n do
  local b = 4 * (i - 1)
  local amount, cap, rate = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local level = levels[i]
  if granted then
    level = level - amount
    bucket_write(KEYS[i], level, cap, rate, now, slack)
  end
  out[#out + 1] = fmt(level)
  out[#out + 1] = fmt(math.max(0, (cap - level) / rate))
end
return out
