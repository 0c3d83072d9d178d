-- ratekeeper levels: the whole tokens available now in each bucket, for
-- `status`. Reads only. (Runs after bucket.lua.)
--
-- KEYS[i]  the hash of bucket i
-- ARGV[1]  "" to use Redis TIME, or a time in ms (tests only)
-- ARGV[2 + 2(i-1)] .. ARGV[3 + 2(i-1)]  bucket i: capacity, refill per minute
--
-- Reply: one integer per bucket, rounded down (negative while reservations wait).
local now = clock(ARGV[1])

local reply = {}
for i, key in ipairs(KEYS) do
  local base = 2 + 2 * (i - 1)
  local level = read_bucket(key, tonumber(ARGV[base]) * UNITS, tonumber(ARGV[base + 1]), now)
  reply[i] = math.floor(level / UNITS)
end
return reply
