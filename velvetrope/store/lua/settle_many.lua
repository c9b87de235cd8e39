-- velvetrope: settle jobs of one tenant tag in one call, each at most once (settle.lua's
-- rules, applied by settle_many in common.lua).
-- KEYS: settle_many's buckets and holds; ARGV: settle_many's without job ids
-- Returns {settled (1/0)} per job.
local settled = settle_many(0, false, clock_now())
return settled
