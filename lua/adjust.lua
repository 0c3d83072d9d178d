-- ratekeeper adjust: refund (or debit) tokens in buckets when a lease is
-- settled, released or cancelled. (Runs after bucket.lua.)
--
-- KEYS[i]  the hash of bucket i
-- ARGV[1]  "" to use Redis TIME, or a time in ms (tests only)
-- ARGV[2 + 3(i-1)] .. ARGV[4 + 3(i-1)]  bucket i: capacity, refill per
--          minute, and the tokens to add (negative: to take)
--
-- Reply: the number of buckets adjusted. A bucket that ends full is deleted.
local now = clock(ARGV[1])

for i, key in ipairs(KEYS) do
  local base = 2 + 3 * (i - 1)
  local capacity = tonumber(ARGV[base]) * UNITS
  local rate = tonumber(ARGV[base + 1])
  local level, updated = read_bucket(key, capacity, rate, now)
  level = math.min(capacity, level + tonumber(ARGV[base + 2]) * UNITS)
  write_bucket(key, level, updated, capacity, rate)
end
return #KEYS
