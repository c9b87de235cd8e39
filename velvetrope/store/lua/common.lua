-- velvetrope: prelude prepended to every script (see velvetrope.store.redis_store.load_script).
-- Redis TIME is the only clock; a bucket is a hash {l = level, t = last refill, seconds}.
-- The rules are those of velvetrope.core.bucket.MemoryBuckets (one table of test vectors
-- runs against both).
local function clock_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function fmt(x)
  return string.format('%.17g', x)
end

-- A finite x as the integers m, e with x = m * 2^e exactly (Redis replies a Lua number as
-- an integer; a string would cost a format and an allocation).
local function out_exact(out, x)
  local m, e = math.frexp(x)
  out[#out + 1] = m * 9007199254740992
  out[#out + 1] = e - 53
end

-- A bucket's level at now, refilled at rate up to cap, and whether its key exists (a
-- missing bucket is full).  A bucket of rate 0 (a budget) keeps its capacity as written
-- (c): given another (a reload), its level moves by the difference, so what was used stays
-- used (velvetrope.core.bucket.TokenBucket.reshape).
local function bucket_level(key, cap, rate, now)
  local h = redis.call('HMGET', key, 'l', 't', 'c')
  local level, last = tonumber(h[1]), tonumber(h[2])
  if level == nil or last == nil then
    return cap, false
  end
  if rate <= 0 then
    local was = tonumber(h[3])
    if was ~= nil and was ~= cap then
      level = level + cap - was
    end
    return level, true
  end
  if now > last then
    level = level + (now - last) * rate
    if level > cap then level = cap end
  end
  return level, true
end

-- A bucket of rate 0 never refills (a budget whose key names its window, or a ledger
-- counter): it is kept this long after its last write, 400 days (velvetrope.core.quota).
local NO_REFILL_TTL_MS = 34560000000

-- The expiry (ms) of a bucket written at level: when it would be full again, plus slack.
local function bucket_ttl(level, cap, rate, slack_ms)
  if rate <= 0 then
    return NO_REFILL_TTL_MS
  end
  return math.ceil(math.max(0, (cap - level) / rate) * 1000) + slack_ms
end

-- Write a bucket's level at now (and a budget's capacity: see bucket_level).  Redis writes
-- the numbers passed to redis.call as strings that read back as the same double.
local function bucket_set(key, level, cap, rate, now)
  if rate <= 0 then
    redis.call('HSET', key, 'l', level, 't', now, 'c', cap)
  else
    redis.call('HSET', key, 'l', level, 't', now)
  end
end

local function bucket_write(key, level, cap, rate, now, slack_ms)
  bucket_set(key, level, cap, rate, now)
  redis.call('PEXPIRE', key, bucket_ttl(level, cap, rate, slack_ms))
end

-- Reserve n claims, all or none: bucket i is KEYS[k0 + i], its amount, capacity, rate and
-- floor are ARGV[a0 + 4(i-1) + 1..4].  A grant writes the job's hold (hold_key); a job
-- that holds one already (the same call sent again: a client retrying after a lost reply)
-- is granted without taking anything twice.
-- Returns {1, levels...} or {0, wait_s, worst_index, levels...}: each bucket's level after
-- the call as out_exact's pair (the caller derives the time to full from it).
local function reserve_claims(k0, n, a0, slack, hold_key, hold_ttl, now)
  local again = not redis.call('SET', hold_key, '1', 'EX', hold_ttl, 'NX')
  local levels, nums = {}, {}  -- nums: each claim's amount, capacity, rate (parsed once)
  local worst, worst_i = 0, 0
  for i = 1, n do
    local b = a0 + 4 * (i - 1)
    local amount, cap, rate = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    nums[3 * i - 2], nums[3 * i - 1], nums[3 * i] = amount, cap, rate
    local level = bucket_level(KEYS[k0 + i], cap, rate, now)
    levels[i] = level
    local w = 0
    if amount > cap then
      w = math.huge
    elseif level < amount and amount > 0 then  -- a claim of nothing: granted, even in debt
      w = rate > 0 and (amount - level) / rate or math.huge
    end
    if w > worst then
      worst, worst_i = w, i
    end
  end
  local out = {}
  local granted = again or worst == 0
  if granted then
    out[1] = 1
  else
    out[1] = 0
    out[2] = fmt(worst)
    out[3] = worst_i
    redis.call('DEL', hold_key)
  end
  for i = 1, n do
    local level = levels[i]
    if granted and not again then
      level = level - nums[3 * i - 2]
      bucket_write(KEYS[k0 + i], level, nums[3 * i - 1], nums[3 * i], now, slack)
    end
    out_exact(out, level)
  end
  return out
end

-- Settle n lines if the job's hold exists (deleting it): bucket i is KEYS[k0 + i], its
-- reserved, actual, capacity, rate and floor are ARGV[a0 + 5(i-1) + 1..5].  A missing
-- bucket refilled to capacity and expired: it counts as full.  A bucket whose level does
-- not drop keeps its expiry (later than it needs).  Returns 1 if applied.
local function settle_claims(hold_key, k0, n, a0, slack, now)
  if redis.call('DEL', hold_key) == 0 then
    return 0
  end
  for i = 1, n do
    local b = a0 + 5 * (i - 1)
    local reserved, actual = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
    local cap, rate, floor = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
    local before, found = bucket_level(KEYS[k0 + i], cap, rate, now)
    local level = before + reserved - actual
    if level < floor then
      level = floor
    elseif level > cap then
      level = cap
    end
    if found and level >= before then
      -- not lower: the expiry set when the level was this low or lower is late enough
      bucket_set(KEYS[k0 + i], level, cap, rate, now)
    else
      bucket_write(KEYS[k0 + i], level, cap, rate, now, slack)
    end
  end
  return 1
end

-- Settle the jobs of one call (finish_many.lua, settle_many.lua), each exactly as
-- settle_claims would, one after the other, at one instant (now).  The buckets are
-- KEYS[k0 + 1..k0 + u], u = ARGV[2], each bucket b with its capacity, rate and floor at
-- ARGV[3b..3b + 2]; job j's hold is KEYS[k0 + u + j].  From ARGV[3u + 3] on, per job: its id
-- (with_ids), its number of lines n, then n times (bucket b, reserved, actual).  A bucket
-- is read once and written once: its level moves through the jobs' lines in order here,
-- and it gets the expiry the last job that lowered it (or found it missing) would have set.
-- Every bucket is read before any hold is deleted: a bucket that cannot be read (a key of
-- another type) fails the call having changed nothing, so the caller can send the jobs
-- again one by one and all but the offending one settle.
-- With marker_ttl (ledger_many.lua) a job's key is not its hold but a marker, taken (SET NX,
-- kept marker_ttl seconds) as its lines apply: a job whose marker exists is skipped.
-- Returns each job's 1 (settled) or 0, and the jobs' ids (with_ids).
local function settle_many(k0, with_ids, now, marker_ttl)
  local slack, u = tonumber(ARGV[1]), tonumber(ARGV[2])
  local shape = {}
  for i = 3, 3 * u + 2 do
    shape[i] = tonumber(ARGV[i])
  end
  local state, touched, settled, ids = {}, {}, {}, {}
  for b = 1, u do
    local key = KEYS[k0 + b]
    if state[key] == nil then  -- {level, found, expiry (ms) to set or false, written, b}
      local level, found = bucket_level(key, shape[3 * b], shape[3 * b + 1], now)
      state[key] = {level, found, false, false, b}
    end
  end
  local a, last, j = 3 * u + 3, #ARGV, 0
  while a <= last do
    j = j + 1
    if with_ids then
      ids[j] = ARGV[a]
      a = a + 1
    end
    local n = tonumber(ARGV[a])
    a = a + 1
    if marker_ttl then
      settled[j] = redis.call('SET', KEYS[k0 + u + j], '1', 'EX', marker_ttl, 'NX') and 1 or 0
    else
      settled[j] = redis.call('DEL', KEYS[k0 + u + j])
    end
    if settled[j] == 1 then
      for p = a, a + 3 * n - 1, 3 do
        local b = tonumber(ARGV[p])
        local key, cap, rate, floor = KEYS[k0 + b], shape[3 * b], shape[3 * b + 1], shape[3 * b + 2]
        local st = state[key]
        if not st[4] then
          st[4] = true
          touched[#touched + 1] = key
        end
        local before = st[1]
        local level = before + tonumber(ARGV[p + 1]) - tonumber(ARGV[p + 2])
        if level < floor then
          level = floor
        elseif level > cap then
          level = cap
        end
        if not (st[2] and level >= before) then
          st[3] = bucket_ttl(level, cap, rate, slack)
        end
        st[1], st[2] = level, true
      end
    end
    a = a + 3 * n
  end
  for _, key in ipairs(touched) do
    local st = state[key]
    bucket_set(key, st[1], shape[3 * st[5]], shape[3 * st[5] + 1], now)
    if st[3] then
      redis.call('PEXPIRE', key, st[3])
    end
  end
  return settled, ids
end

-- The expiry (whole ms) of a lease taken or renewed at now (s) for ttl (s).
local function lease_expiry(ttl, now)
  return math.floor(now * 1000) + math.ceil(ttl * 1000)
end

-- A pool's leases: zset zkey (job id -> expiry, in whole ms) and hash hkey (job id ->
-- tokens, '_total' -> their sum).  Expiries are integers: a small sorted set (a ziplist)
-- keeps them as integers and compares them as such when it inserts (a fraction is kept as a
-- string, parsed back at every comparison).  Only a lease taken under a token cap has its
-- tokens recorded there; forgetting an id without a record changes nothing, so leases taken
-- with and without a cap share one pool.  Forget the given ids' tokens.
local function lease_forget(hkey, ids)
  for _, id in ipairs(ids) do
    local tk = tonumber(redis.call('HGET', hkey, id))
    if tk then
      redis.call('HDEL', hkey, id)
      redis.call('HINCRBY', hkey, '_total', -tk)
    end
  end
end

-- Take a slot for id (dropping expired leases first); a pool with nothing in flight always
-- grants one; a lease already held is renewed.  max_tok < 0: no token cap, so the lease's
-- tokens are neither checked nor recorded.  Returns {granted, in flight, tokens}, tokens
-- being the recorded sum (-1 without a cap, which does not read it).
local function lease_take(zkey, hkey, id, tokens, max_n, max_tok, ttl, now)
  local now_ms = math.floor(now * 1000)
  local expiry = lease_expiry(ttl, now)
  local dead = redis.call('ZRANGEBYSCORE', zkey, '-inf', now_ms)
  if #dead > 0 then
    lease_forget(hkey, dead)
    redis.call('ZREMRANGEBYSCORE', zkey, '-inf', now_ms)
  end
  local n = redis.call('ZCARD', zkey)
  local capped = max_tok >= 0
  local total = -1
  if capped then
    total = tonumber(redis.call('HGET', hkey, '_total')) or 0
  end
  if n > 0 and (n >= max_n or (capped and total + tokens > max_tok)) then
    if not redis.call('ZSCORE', zkey, id) then
      return {0, n, total}
    end
    redis.call('ZADD', zkey, expiry, id)
    return {1, n, total}
  end
  if redis.call('ZADD', zkey, expiry, id) == 0 then
    return {1, n, total}  -- already held: renewed
  end
  redis.call('EXPIRE', zkey, math.ceil(ttl * 2))
  if capped then
    redis.call('HSET', hkey, id, tokens)
    total = redis.call('HINCRBY', hkey, '_total', tokens)
    redis.call('EXPIRE', hkey, math.ceil(ttl * 2))
  end
  return {1, n + 1, total}
end

-- Give back the leases of ids (unknown ids skipped); returns how many were held.
local function lease_give(zkey, hkey, ids)
  local held = {}
  for _, id in ipairs(ids) do
    if redis.call('ZREM', zkey, id) == 1 then
      held[#held + 1] = id
    end
  end
  lease_forget(hkey, held)
  return #held
end
