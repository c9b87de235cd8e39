-- velvetrope: give back the leases of jobs that ended (idempotent: unknown ids are skipped).
-- KEYS as lease_acquire.lua; ARGV: job ids.  Returns how many leases were released.
return lease_give(KEYS[1], KEYS[2], ARGV)
