-- velvetrope: settle one job's claims, at most once per job id.
-- KEYS[1]: the job's hold (written by reserve.lua); KEYS[1+i]: bucket hash
-- ARGV[1]: ttl slack ms; per line i, at 1+5(i-1)+1..: reserved, actual, capacity, rate, floor
-- Only a job whose hold exists is settled, and settling deletes the hold: a second settle,
-- or the settlement of a reservation that never happened, changes nothing.
-- A missing bucket is one that refilled to capacity and expired: it counts as full.
-- Returns 1 when applied, 0 otherwise.
if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
local now = clock_now()
local slack = tonumber(ARGV[1])
for i = 1, #KEYS - 1 do
  local b = 1 + 5 * (i - 1)
  local reserved, actual = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local cap, rate, floor = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local level = bucket_level(KEYS[i + 1], cap, rate, now) + reserved - actual
  if level < floor then
    level = floor
  elseif level > cap then
    level = cap
  end
  bucket_write(KEYS[i + 1], level, cap, rate, now, slack)
end
return 1
