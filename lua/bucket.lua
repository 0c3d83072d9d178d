-- ratekeeper's bucket library, written once: the daemon prepends this file
-- to batch.lua, cancel.lua and levels.lua when it embeds them (so do
-- the benchmarks), since a Redis script cannot load another.
--
-- A bucket is a hash: field l = level in units, t = time of l in ms (and,
-- for a bucket that never refills, k = the capacity l was written under;
-- see refill).
-- Every figure a script gets is already in the bucket's units, which the
-- daemon chose so that a millisecond refills a whole number of them (for a
-- rate per minute, 60000 units a token and R units a ms); every number stays
-- an integer below 2^53, exact in a double. src/limiter/bucket.rs is the
-- same arithmetic in Rust.
--
-- A rate of 0 is a bucket that never refills (a spend budget for one
-- calendar period, whose key names the period): only refunds raise it, and
-- its key is kept until its keep-until instant (Unix ms, given per bucket),
-- not until it would be full again, which it never is by itself. Nor can
-- it fill up to a capacity that a config reload raised: read under another
-- capacity than its k, its level moves by the change (see refill).

-- The script's clock in ms: Redis TIME (argument ""), or a test time.
local function clock(arg)
  if arg ~= "" then
    return tonumber(arg)
  end
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

-- A bucket as stored: its level and the time of it (nil, nil for a missing
-- key: a full bucket), and what batch.lua keeps beside them: for provider
-- feedback n, the units ever drawn by acquires while the bucket was not
-- full, and hs, the last slot of its draw history (nil while it keeps none);
-- then the two shapes it was last drawn with, w1 and w2 (strings or false),
-- read in the same call because every batch needs them; p, the units
-- provider feedback ever lowered it by; and k, the capacity the level was
-- written under (nil but for a bucket that never refills).
local function read_stored(key)
  local state = redis.call('HMGET', key, 'l', 't', 'n', 'hs', 'w1', 'w2', 'p', 'k')
  if not state[1] then
    return nil, nil, 0, nil, false, false, 0, nil
  end
  return tonumber(state[1]), tonumber(state[2]), tonumber(state[3]) or 0, tonumber(state[4]),
    state[5], state[6], tonumber(state[7]) or 0, tonumber(state[8])
end

-- How far back the clock may step and still be waited for, ms. A clock
-- that steps back further (a failover to a node whose clock lags) is
-- followed from where it is, or refill would freeze until it caught up.
local CLOCK_STEP_BACK = 1000

-- A stored level brought to `now` with the bucket's capacity and rate: the
-- level and the time it holds for. A clock that stepped back a little
-- refills nothing; one that stepped back further refills from now on.
-- Capped even then: a capacity lowered by a config reload holds at once,
-- as in src/limiter/bucket.rs. A bucket that never refills cannot fill up
-- to a raised capacity, nor should a cut one forget what was spent above
-- it: written under capacity `written` (its k), its level first moves by
-- the change, so that capacity - level (spent and reserved) is kept
-- (BucketState::rebased). Without a k (written before this rule; a
-- missing bucket is full) it was written under the capacity in force.
local function refill(level, updated, capacity, rate, now, written)
  if level == nil then
    return capacity, now
  end
  if rate == 0 and written then
    level = level + capacity - written
  end
  if now > updated then
    level = level + (now - updated) * rate
    updated = now
  elseif updated - now > CLOCK_STEP_BACK then
    updated = now
  end
  return math.min(capacity, level), updated
end

-- The bucket's level at `now`, refilled and capped, and the time it holds
-- for; then n and hs (see read_stored).
local function read_bucket(key, capacity, rate, now)
  local level, updated, drawn, history, _, _, _, written = read_stored(key)
  level, updated = refill(level, updated, capacity, rate, now, written)
  return level, updated, drawn, history
end

-- How long a bucket that provider feedback places (one with a history, hs)
-- outlives being full: its count of draws n must not start again while a
-- sidecar may still name a grant by it (sidecars remember grants for 10 s).
local PLACED_KEEP = 15000

-- How long a never-refilling bucket's key is kept, ms, when it is written
-- after its keep-until instant has passed (an expiry must be positive):
-- KEPT_PAST_MS in src/limiter/bucket.rs.
local KEPT_PAST = 60000

-- Stores a level at `now`. The key expires when the bucket would be full
-- again, and a full bucket is deleted: then it carries no information,
-- unless feedback places it (history given), which keeps it PLACED_KEEP ms
-- longer. A bucket that never refills (rate 0) expires at `keep` (Unix ms;
-- KEPT_PAST from now once that passed; 0: none, the key is kept), and its
-- level goes with the capacity it is written under (k; see refill): a
-- deleted one reads as full under any capacity, which loses nothing.
-- `drawn` and `history` (batch.lua's n and hs) are written when given.
local function write_bucket(key, level, updated, capacity, rate, keep, now, drawn, history)
  if level >= capacity then
    if not history then
      redis.call('DEL', key)
      return
    end
    level = capacity
  end
  if rate > 0 then
    redis.call('HSET', key, 'l', string.format('%d', level), 't', string.format('%d', updated))
  else
    redis.call('HSET', key, 'l', string.format('%d', level), 't', string.format('%d', updated),
      'k', string.format('%d', capacity))
  end
  if drawn then
    redis.call('HSET', key, 'n', string.format('%d', drawn))
  end
  if history then
    redis.call('HSET', key, 'hs', string.format('%d', history))
  end
  local expiry
  if rate > 0 then
    expiry = ceil_div(capacity - level, rate)
  elseif keep > now then
    expiry = keep - now
  elseif keep > 0 then
    expiry = KEPT_PAST
  else
    redis.call('PERSIST', key)
    return
  end
  if history then
    expiry = expiry + PLACED_KEEP
  end
  redis.call('PEXPIRE', key, string.format('%d', expiry))
end
