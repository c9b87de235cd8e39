-- velvetrope: settle one job's claims, at most once per job id.
-- KEYS[1]: the job's hold (written by reserve.lua); KEYS[1+i]: bucket i
-- ARGV[1]: ttl slack ms; per line i, at 1+5(i-1)+1..: reserved, actual, capacity, rate, floor
-- Only a job whose hold exists is settled, and settling deletes the hold: a second settle,
-- or the settlement of a reservation that never happened, changes nothing.
-- Returns 1 when applied, 0 otherwise.
return settle_claims(KEYS[1], 1, #KEYS - 1, 1, tonumber(ARGV[1]), clock_now())
