-- velvetrope: write into the usage ledger the counts of jobs a replica settled in its local
-- fallback (fail_open, Redis away when they were reserved), each job at most once: its
-- marker ({tag}:ledgered:{id}, kept two days, longer than any outbox retries) is taken
-- with its counts, and a job whose marker exists is skipped (a reply lost, sent again).
-- KEYS: settle_many's ledger buckets, then the jobs' markers; ARGV: settle_many's without
-- job ids, each line reserved 0 and actual the count.  Returns {written (1/0)} per job.
local written = settle_many(0, false, clock_now(), 172800)
return written
