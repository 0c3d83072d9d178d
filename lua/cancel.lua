-- ratekeeper cancel: undo a batch call whose answer never arrived, or keep
-- it from running late. (Runs after bucket.lua.)
--
-- A call the sidecar gave up on (a timeout, a connection that broke after
-- the call was sent) may have run, may still run, or may never run. This
-- script settles it: if the call's record shows it ran, every bucket gets
-- its change back; either way the record becomes a tombstone, so the call
-- finds it and does nothing if it arrives late.
--
-- KEYS[1]    the call's record: PREFIX:{TAG}:call:ID
-- KEYS[2..]  the buckets of the call, in the call's order
-- ARGV[1]    "" to read the clock with Redis TIME, or a time in ms (tests)
-- ARGV[2]    how long the tombstone is kept, in ms
-- ARGV[3(i-1)] .. ARGV[3(i-1) + 2]  for KEYS[i], i >= 2: capacity, refill
--            rate, in the bucket's units (per ms), and keep-until instant
--            (Unix ms; 0: none), as batch.lua takes them; a bucket of rate 0
--            is read and written under that capacity (k, see refill in
--            bucket.lua), so that a reload since moves it as a batch would
--
-- Reply: 1 the call had run and is undone; 0 it had not run, and now never
-- will; -1 it was cancelled already.
local record = KEYS[1]
local previous = redis.call('GET', record)
redis.call('SET', record, 'x', 'PX', ARGV[2])
if previous == 'x' then
  return -1
end
if not previous then
  return 0
end

local now = clock(ARGV[1])
local _, changes = cmsgpack.unpack(previous)
for index, units in string.gmatch(changes, '(%d+):(%-?%d+)') do
  index = tonumber(index)
  local base = 3 * (index - 1)
  local capacity = tonumber(ARGV[base])
  local rate = tonumber(ARGV[base + 1])
  local keep = tonumber(ARGV[base + 2])
  local level, updated, drawn, history = read_bucket(KEYS[index], capacity, rate, now)
  write_bucket(KEYS[index], math.min(capacity, level - tonumber(units)), updated, capacity, rate,
    keep, now, drawn, history)
end
return 1
