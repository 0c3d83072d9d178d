-- ratekeeper acquire: reserve a cost in every bucket of one acquire, or in none.
--
-- KEYS[i]  the hash of bucket i: field l = level in units, t = time of l in ms
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
--
-- One token is 60000 units, so R tokens per minute refill exactly R units per
-- ms; every number stays an integer far below 2^53, exact in a double.
-- src/limiter/bucket.rs is the same arithmetic in Rust.
local UNITS = 60000
local max_wait = tonumber(ARGV[1])
local now
if ARGV[2] == "" then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[2])
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

local levels, times, rates, capacities, costs = {}, {}, {}, {}, {}
local longest, longest_index = 0, 1
for i, key in ipairs(KEYS) do
  local base = 3 + 4 * (i - 1)
  local capacity = tonumber(ARGV[base]) * UNITS
  local rate = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
  local floor = tonumber(ARGV[base + 3])
  if cost + floor > tonumber(ARGV[base]) then
    return {-1, i}
  end
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
  local level = levels[i] - costs[i] * UNITS
  redis.call('HSET', key, 'l', string.format('%d', level), 't', string.format('%d', times[i]))
  -- The key expires when the bucket is full again: then it carries nothing.
  redis.call('PEXPIRE', key, string.format('%d', ceil_div(capacities[i] - level, rates[i])))
end
return {1, longest}
