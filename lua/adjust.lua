-- ratekeeper adjust: refund (or debit) tokens in buckets when a lease is
-- settled, released or cancelled.
--
-- KEYS[i]  the hash of bucket i (see acquire.lua)
-- ARGV[1]  "" to use Redis TIME, or a time in ms (tests only)
-- ARGV[2 + 3(i-1)] .. ARGV[4 + 3(i-1)]  bucket i: capacity, refill per
--          minute, and the tokens to add (negative: to take)
--
-- Reply: the number of buckets adjusted. A bucket that ends full is deleted:
-- a missing key reads as a full bucket.
local UNITS = 60000
local now
if ARGV[1] == "" then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[1])
end

for i, key in ipairs(KEYS) do
  local base = 2 + 3 * (i - 1)
  local capacity = tonumber(ARGV[base]) * UNITS
  local rate = tonumber(ARGV[base + 1])
  local delta = tonumber(ARGV[base + 2]) * UNITS
  local state = redis.call('HMGET', key, 'l', 't')
  local level, updated = capacity, now
  if state[1] then
    level = tonumber(state[1])
    updated = tonumber(state[2])
    if now > updated then
      level = math.min(capacity, level + (now - updated) * rate)
      updated = now
    end
  end
  level = math.min(capacity, level + delta)
  if level >= capacity then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'l', string.format('%d', level), 't', string.format('%d', updated))
    redis.call('PEXPIRE', key, string.format('%d', math.floor((capacity - level + rate - 1) / rate)))
  end
end
return #KEYS
