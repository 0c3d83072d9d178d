-- ratekeeper slots: a limit's concurrency slots, a sorted set of holders
-- scored by the time (ms) after which each is presumed lost (its sidecar
-- crashed). (Runs after bucket.lua, for its clock.) src/limiter/slots.rs
-- is the same rule in Rust.
--
-- KEYS[1]  the slots
-- ARGV[1]  "" to use Redis TIME, or a time in ms (tests only)
-- ARGV[2]  "take", "give" or "held"
-- ARGV[3]  the holder (take, give): unique across the fleet
-- ARGV[4]  slots in all (take)
-- ARGV[5]  how long a holder keeps its slot at most, in ms (take)
--
-- Reply: take: 1 taken (or already held by this holder, so a retried take
-- is answered the same), 0 every slot is held; give: 1; held: the count.
local key = KEYS[1]
local now = clock(ARGV[1])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

local op = ARGV[2]
if op == 'take' then
  local holder = ARGV[3]
  if redis.call('ZSCORE', key, holder) then
    return 1
  end
  if redis.call('ZCARD', key) >= tonumber(ARGV[4]) then
    return 0
  end
  local timeout = tonumber(ARGV[5])
  redis.call('ZADD', key, now + timeout, holder)
  -- The set lives as long as its last holder.
  if redis.call('PTTL', key) < timeout then
    redis.call('PEXPIRE', key, timeout)
  end
  return 1
elseif op == 'give' then
  redis.call('ZREM', key, ARGV[3])
  return 1
end
return redis.call('ZCARD', key)
