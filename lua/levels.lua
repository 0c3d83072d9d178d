-- ratekeeper levels: the whole tokens available now in each bucket, for
-- `status`. Reads only.
--
-- KEYS[i]  the hash of bucket i (see acquire.lua)
-- ARGV[1]  "" to use Redis TIME, or a time in ms (tests only)
-- ARGV[2 + 2(i-1)] .. ARGV[3 + 2(i-1)]  bucket i: capacity, refill per minute
--
-- Reply: one integer per bucket, rounded down (negative while reservations wait).
local UNITS = 60000
local now
if ARGV[1] == "" then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[1])
end

local reply = {}
for i, key in ipairs(KEYS) do
  local base = 2 + 2 * (i - 1)
  local capacity = tonumber(ARGV[base]) * UNITS
  local rate = tonumber(ARGV[base + 1])
  local state = redis.call('HMGET', key, 'l', 't')
  local level = capacity
  if state[1] then
    level = tonumber(state[1])
    local updated = tonumber(state[2])
    if now > updated then
      level = math.min(capacity, level + (now - updated) * rate)
    end
  end
  reply[i] = math.floor(level / UNITS)
end
return reply
