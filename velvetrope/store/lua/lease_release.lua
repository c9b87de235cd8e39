-- velvetrope: give back the leases of jobs that ended (idempotent: unknown ids are skipped).
-- KEYS as lease_acquire.lua; ARGV: job ids.  Returns how many leases were released.
local held = {}
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    held[#held + 1] = id
  end
end
return lease_forget(KEYS[1], KEYS[2], held)
