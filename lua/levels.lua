-- ratekeeper levels: the units available now in each bucket, for
-- `status`. Reads only. (Runs after bucket.lua.)
--
-- KEYS[i]  the hash of bucket i
-- ARGV[1]  "" to use Redis TIME, or a time in ms (tests only)
-- ARGV[2 + 2(i-1)] .. ARGV[3 + 2(i-1)]  bucket i: capacity and refill rate,
--          in its units (per ms)
--
-- Reply: one integer per bucket, its level in units (negative while
-- reservations wait; a bucket of rate 0 moved by a change of capacity since
-- it was written, as the next batch would move it: see refill in
-- bucket.lua); the daemon turns it into whole tokens.
local now = clock(ARGV[1])

local reply = {}
for i, key in ipairs(KEYS) do
  local base = 2 + 2 * (i - 1)
  reply[i] = read_bucket(key, tonumber(ARGV[base]), tonumber(ARGV[base + 1]), now)
end
return reply
