-- ratekeeper acquire: reserve a cost in every bucket of one acquire, or in none.
-- (Runs after bucket.lua.)
--
-- KEYS[i]  the hash of bucket i
-- ARGV[1]  max wait in ms
-- ARGV[2]  "" to read the clock with Redis TIME (always, in production), or a
--          time in ms (tests drive the script and the Rust store in lockstep)
-- ARGV[3 + 4(i-1)] .. ARGV[6 + 4(i-1)]  bucket i: capacity, refill per minute,
--          cost and floor (tokens kept for higher priority classes), in tokens
--
-- Reply, integers only (a Lua number would be truncated anyway):
--   {1, wait_ms}                         reserved in every bucket
--   {0, retry_after_ms, bucket_index}    reserved nothing; bucket_index (from
--                                        1) needs the longest wait
--   {-1, bucket_index}                   that bucket can never hold the cost
local max_wait = tonumber(ARGV[1])
local now = clock(ARGV[2])

local levels, times, rates, capacities, costs = {}, {}, {}, {}, {}
local longest, longest_index = 0, 1
for i, key in ipairs(KEYS) do
  local base = 3 + 4 * (i - 1)
  local capacity_tokens = tonumber(ARGV[base])
  local rate = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
  local floor = tonumber(ARGV[base + 3])
  if cost + floor > capacity_tokens then
    return {-1, i}
  end
  local capacity = capacity_tokens * UNITS
  local level, updated = read_bucket(key, capacity, rate, now)
  local missing = (cost + floor) * UNITS - level
  local wait = 0
  if missing > 0 then
    wait = ceil_div(missing, rate)
  end
  if wait > longest then
    longest, longest_index = wait, i
  end
  levels[i], times[i], rates[i], capacities[i], costs[i] = level, updated, rate, capacity, cost
end

if longest > max_wait then
  return {0, longest - max_wait, longest_index}
end

for i, key in ipairs(KEYS) do
  write_bucket(key, levels[i] - costs[i] * UNITS, times[i], capacities[i], rates[i])
end
return {1, longest}
