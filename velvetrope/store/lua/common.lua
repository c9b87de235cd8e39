-- velvetrope: prelude prepended to every script (see velvetrope.store.redis_store.load_script).
-- Redis TIME is the only clock; a bucket is a hash {l = level, t = last refill, seconds}.
local function clock_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- A bucket's level at now, refilled at rate up to cap; a missing bucket is full.
local function bucket_level(key, cap, rate, now)
  local h = redis.call('HMGET', key, 'l', 't')
  local level, last = tonumber(h[1]), tonumber(h[2])
  if level == nil or last == nil then
    return cap
  end
  if now > last then
    level = level + (now - last) * rate
    if level > cap then level = cap end
  end
  return level
end

local function fmt(x)
  return string.format('%.17g', x)
end

local function bucket_write(key, level, cap, rate, now, slack_ms)
  redis.call('HSET', key, 'l', fmt(level), 't', fmt(now))
  redis.call('PEXPIRE', key, math.ceil(math.max(0, (cap - level) / rate) * 1000) + slack_ms)
end

-- Drop a pool's expired leases (zset id -> expiry; hash id -> tokens, '_total' -> sum).
local function lease_forget(zkey, hkey, ids)
  local n = 0
  for _, id in ipairs(ids) do
    local tk = tonumber(redis.call('HGET', hkey, id))
    if tk then
      redis.call('HDEL', hkey, id)
      redis.call('HINCRBY', hkey, '_total', -tk)
    end
    n = n + 1
  end
  return n
end
