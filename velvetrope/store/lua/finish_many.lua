-- velvetrope: jobs of one tenant tag and one pool ended: settle each (settle_many, the rules
-- of settle.lua) and give back each one's slot (lease_release.lua), in one call.
-- KEYS[1], KEYS[2]: the pool's lease zset, hash; then settle_many's buckets and holds
-- ARGV: settle_many's with the job ids (common.lua)
-- Returns {settled (1/0), lease released (0/1)} per job, flattened.
local settled, ids = settle_many(2, true, clock_now())
local out, held = {}, {}
for j, id in ipairs(ids) do
  local released = redis.call('ZREM', KEYS[1], id)
  if released == 1 then
    held[#held + 1] = id
  end
  out[2 * j - 1], out[2 * j] = settled[j], released
end
lease_forget(KEYS[2], held)
return out
