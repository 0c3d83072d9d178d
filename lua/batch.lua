-- ratekeeper batch: the acquires and settlements of one hash slot, in the
-- order the sidecar received them, as one script call. (Runs after
-- bucket.lua.)
--
-- Each operation sees the buckets exactly as if it ran alone at the same
-- time: the batch is the same as its operations one by one, but reads and
-- writes each bucket once. A call is recorded under its id for a while, so
-- that running it again (a retry after a broken connection) only returns
-- the first answer, and cancel.lua can undo it (or keep it from running late).
--
-- KEYS[1]    the call's record: PREFIX:{TAG}:call:ID
-- KEYS[2..]  the buckets the operations touch, each once
-- ARGV       either the values below one by one, or (what the daemon sends)
--            a single argument: all of them packed in one msgpack array
-- ARGV[1]    "" to read the clock with Redis TIME (always, in production),
--            or a time in ms (tests drive the script and the Rust store in lockstep)
-- ARGV[2]    how long the record is kept, in ms
-- ARGV[3]    the number of operations
-- ARGV[4]    the sidecar's id (random, one per daemon process): whose shapes
--            are whose, below
-- ARGV[5..]  for each bucket of KEYS[2..] in turn: its capacity, refill
--            rate, largest cost and keep-until instant (Unix ms after which
--            a bucket of rate 0, which never refills, may be forgotten; 0:
--            none; see write_bucket), sent once a call, not with every draw;
--            then each operation, every amount in the bucket's units and
--            every rate in units per ms:
--   "a", max wait ms, n, and n times: key index (into KEYS), cost, floor
--        (kept for higher classes)
--   "s", n, and n times: key index, units to add (negative: an overrun to
--        take, within the bucket's overrun debt: see take_overrun)
--   "l", n, and n times: key index, a level that the bucket is lowered to if
--        it is above it (provider feedback; never raises), then the
--        provider's remaining count (-1: none), how long ago (ms) the
--        answered call was reserved (-1: unknown), at most how long ago
--        the provider counted (ms), the answered call's draw mark (the
--        bucket's n right after it drew, less what may have reached the
--        provider after it; -1: unknown), and what the answered call holds
--        in the bucket if the provider refused it (a 429; else 0): see below
--   "c", n, and n times: key index, capacity, refill rate, largest cost,
--        keep-until: the bucket's shape from the next operation on (a
--        config reload between two of the call's operations; a bucket of
--        rate 0 moves by the change of capacity, see below); no reply
--
-- A draw whose cost with its floor is above the bucket's capacity, but not
-- above its largest cost, waits until the bucket is full and then takes it
-- below zero: a provider that enforces its minute per second still passes
-- a request larger than a second's worth once its bucket is full.
--
-- A bucket of rate 0 never refills (a spend budget per calendar period):
-- a draw it cannot cover is denied whatever the wait allowed, with a
-- retry_after of exactly NEVER (NEVER_MS in src/limiter/bucket.rs), and it
-- is the draw named even when others would wait too (the first such). Its
-- level is written with the capacity in force (field k), and whenever the
-- capacity in force differs from the one its level is at (a reload, from
-- the next call or the next "c" on; another sidecar's shape coming into
-- force or leaving it), the level first moves by the difference: the
-- budget's new amount holds for the current period at once, and what was
-- spent stays spent (refill in bucket.lua, BucketState::rebased in
-- src/limiter/bucket.rs).
--
-- Provider feedback across sidecars. A bucket counts in n the units its
-- acquires ever drew. Once a lowering carries a count, the bucket also
-- keeps a history: for each slot of HISTORY_SLOT ms in which it was
-- drawn from, n at the slot's first draw (field h<slot mod HISTORY_SLOTS> =
-- "slot:n"). A later lowering then also lowers it to the provider's count
-- less everything the fleet drew since the answered call was reserved,
-- n now - n then: calls the provider had not seen, whichever sidecar
-- granted them. (A sidecar alone knows only its own.) A lowering that
-- carries the answered call's mark (the n its grant's reply gave, which a
-- sidecar keeps with the lease that feedback names) subtracts n now less
-- the mark instead: exactly what the fleet drew after it, no slot rounding.
-- A bucket with a history outlives being full for a while (PLACED_KEEP in
-- bucket.lua), so that n does not start again under a mark.
--
-- Reservations already promised. A lowering moves the bucket's whole
-- future down, and with it the time at which each reservation still
-- waiting finds its units: a reservation granted before it must wait
-- longer too, by the units lowered over the rate, or it reaches the
-- provider when the provider's bucket does not have them (foreign traffic
-- drains it while a queue of reservations waits). The bucket counts in p
-- the units lowerings took from it, each at most the provider's room when
-- it counted (the capacity less its count, without the refill credited
-- since): a provider that is full passes the next calls anyway, and
-- postponing them further would let it overflow and waste its refill,
-- which the next count shows as a shortfall, to postpone them further
-- still. Every grant and every lowering answers p, and the sidecar holding
-- a reservation waits for what p grew since its grant
-- (src/limiter/lowered.rs).
--
-- Sidecars that disagree. A bucket that the call writes also keeps the two
-- shapes (capacity, rate, largest cost) it was last drawn with, each with
-- the sidecar that last drew with it and when (fields w1, w2:
-- "sidecar:capacity:rate:largest:ms", refreshed at most once a
-- SHAPE_REFRESH). When another sidecar drew with another shape within
-- SHAPE_WINDOW ms (a config rollout under way, or a forgotten sidecar), the
-- call draws with the smaller capacity, rate and largest cost of the two,
-- and says so in its status. A sidecar's own earlier shape (before a
-- reload) is replaced, not a disagreement. The keep-until instant is not
-- part of a shape: it changes no level, and each sidecar's gives a budget's
-- key a life past its period's end.
--
-- Reply, integers only: {{status}, one reply per operation...}
--   status 1: ran now; 2: ran before, these are its replies; 0: cancelled
--             before it ran, so it did nothing (and no replies follow).
--             After a 1, for each bucket drawn with another sidecar's shape
--             as well: its key index, and that shape's capacity and rate
--   acquire:    {1, wait_ms, n..., p...}           reserved in every bucket;
--                                                  then each draw's bucket's
--                                                  n right after it (its mark),
--                                                  then each one's p
--               {0, retry_after_ms, draw_index}    reserved nothing; the draw
--                                                  (from 1) needing the longest wait
--                                                  (retry_after_ms NEVER: a
--                                                  bucket that never refills)
--               {-1, draw_index}                   that draw can never fit
--   settlement: {2, (change, units)...}           then, for each overrun not
--                                                  wholly taken, its number
--                                                  (from 1) and the units left
--   lowering:   {3, p...}                          each lowered bucket's p
--                                                  after it, in order
-- Globals are looked up by name at each use; the loops below use these often.
local tonumber, ARGV, KEYS = tonumber, ARGV, KEYS
-- Packed, the arguments are one string for Redis to parse and hand over
-- instead of nine an acquire (bench/PROFILE.md, eighth pass).
if #ARGV == 1 then
  ARGV = cmsgpack.unpack(ARGV[1])
end
local record = KEYS[1]
local previous = redis.call('GET', record)
if previous == 'x' then
  return {{0}}
end
if previous then
  -- msgpack of {replies} and the deltas: replay the replies, touch nothing.
  local replies = cmsgpack.unpack(previous)
  replies[1] = {2}
  return replies
end

local now = clock(ARGV[1])
local ttl = ARGV[2]
local count = tonumber(ARGV[3])
local sidecar = ARGV[4]

-- Each touched bucket: level and time as stored, read once, and as the
-- batch has them now; the net change (units) of those the batch changed,
-- which are written once at the end. For a bucket of rate 0, also the
-- capacity its stored level was written under (k; nil: the one in force)
-- and the one its level in the batch is at (basis; the capacity in force
-- when the batch last brought it to now).
local stored_level, stored_at, read, written, basis = {}, {}, {}, {}, {}
local level, updated, capacity, rate, largest, delta = {}, {}, {}, {}, {}, {}
-- Each bucket's keep-until instant (0: none), as its latest shape gives it.
local keep = {}
-- The retry_after of a draw that no wait can cover (NEVER_MS in bucket.rs).
local NEVER = 1000000000000000
local drawn, history, lowered, lowered_now = {}, {}, {}, {}
local HISTORY_SLOT, HISTORY_SLOTS, NOTE_LAG = 50, 200, 5
-- own: the shape this sidecar draws each bucket with; other: another
-- sidecar's, when it drew with a different one lately; the shape in force
-- (capacity, rate, largest) is the smaller of the two in each figure.
local own, other, my_slot = {}, {}, {}
for index = 2, #KEYS do
  local base = 4 * index - 3
  own[index] = {tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])}
  capacity[index], rate[index], largest[index] = own[index][1], own[index][2], own[index][3]
  keep[index] = tonumber(ARGV[base + 3])
end
local SHAPE_WINDOW, SHAPE_REFRESH = 30000, 1000
local function in_force(index)
  local mine, theirs = own[index], other[index]
  if theirs then
    capacity[index] = math.min(mine[1], theirs[1])
    rate[index] = math.min(mine[2], theirs[2])
    largest[index] = math.min(mine[3], theirs[3])
  else
    capacity[index], rate[index], largest[index] = mine[1], mine[2], mine[3]
  end
end
-- Reads the bucket's shape slots (as read_stored read them): which to write this sidecar's shape to
-- (my_slot: {field, whether it must be written}), and another sidecar's
-- different shape seen within the window, if any.
local function read_shapes(index, slots)
  local mine = own[index]
  local same, own_old, free, oldest, oldest_at
  for i = 1, 2 do
    local field = 'w' .. i
    local who, c, r, g, at = string.match(slots[i] or '', '^([^:]*):(%-?%d+):(%d+):(%-?%d+):(%-?%d+)$')
    if not who then
      free = free or field
    else
      c, r, g, at = tonumber(c), tonumber(r), tonumber(g), tonumber(at)
      local same_shape = c == mine[1] and r == mine[2] and g == mine[3]
      if same_shape then
        same = {field, who ~= sidecar or now - at >= SHAPE_REFRESH}
      elseif who == sidecar then
        own_old = field
      elseif now - at <= SHAPE_WINDOW then
        other[index] = {c, r, g}
      else
        free = free or field
      end
      if not oldest_at or at < oldest_at then
        oldest, oldest_at = field, at
      end
    end
  end
  my_slot[index] = same or {own_old or free or oldest, true}
  in_force(index)
end

-- Moves the level of a bucket of rate 0 that the batch changed by the
-- change of its capacity in force since (see refill in bucket.lua), as an
-- operation alone would find it after the last one wrote it.
local function rebase(index)
  if rate[index] == 0 and basis[index] then
    level[index] = level[index] + capacity[index] - basis[index]
  end
  basis[index] = rate[index] == 0 and capacity[index] or nil
end
-- Brings a bucket to now for the next operation, as if it ran alone: until
-- the batch changes it, from the stored state with the bucket's shape at
-- this point (a reload, "c", may have changed it since the last operation);
-- after, moved by a changed capacity and capped (the time is the same for
-- the whole call).
local function touch(index)
  if not read[index] then
    read[index] = true
    local w1, w2
    stored_level[index], stored_at[index], drawn[index], history[index], w1, w2, lowered[index],
      written[index] = read_stored(KEYS[index])
    read_shapes(index, {w1, w2})
  end
  if delta[index] == nil then
    level[index], updated[index] = refill(stored_level[index], stored_at[index], capacity[index],
      rate[index], now, written[index])
    basis[index] = rate[index] == 0 and capacity[index] or nil
  else
    rebase(index)
    if level[index] > capacity[index] then
      level[index] = capacity[index]
    end
  end
end
-- Each bucket's overrun debt once the call read it: what reports above
-- their reservations took that refill has not yet paid back (field o,
-- "units:ms"; written with the bucket).
local overrun = {}
-- Adds units; a bucket that ends full is as if deleted and read again.
local function add(index, units)
  local before = level[index]
  level[index] = math.min(capacity[index], before + units)
  delta[index] = (delta[index] or 0) + level[index] - before
  if level[index] >= capacity[index] then
    updated[index] = now
    overrun[index] = 0
  end
end
-- Takes an overrun of `owed` units (a report above its reservation) as far
-- as the bucket's overrun debt allows: the debt stays within one capacity,
-- so reports never push a bucket more than one capacity below where its
-- reservations put it (issue 27: 500 one-token leases reported with huge
-- usage pushed a limit hours into debt). Refill pays the debt back at the
-- bucket's rate, and it is never more than the bucket is below full (a
-- refund pays it too). Returns the units left untaken.
-- BucketState::overrun in src/limiter/bucket.rs is the same rule.
local function take_overrun(index, owed)
  local debt = overrun[index]
  if debt == nil then
    local units, at = string.match(redis.call('HGET', KEYS[index], 'o') or '', '^(%-?%d+):(%-?%d+)$')
    debt = 0
    if units then
      debt = tonumber(units)
      if now > tonumber(at) then
        debt = debt - (now - tonumber(at)) * rate[index]
      end
    end
  end
  debt = math.max(0, math.min(debt, capacity[index] - level[index]))
  local taken = math.min(owed, math.max(0, capacity[index] - debt))
  overrun[index] = debt + taken
  add(index, -taken)
  return owed - taken
end

-- The provider's view, `seen` (its count less the fleet's draws it had not
-- seen), less a margin for what will drain it unseen before the next
-- correction: other traffic on the same key, or a provider slower than
-- configured. Between corrections the gap between the provider's view and
-- the bucket shrinks by that drain; each correction measures how much it
-- shrank since the last (fields c: its time, m: the gap it left). The
-- shrinks added up are the unseen drain so far, a line in time plus each
-- count's noise: the rate is its slope, fitted by exponentially weighted
-- least squares over about DRAIN_WINDOW ms (the fit's sums about the
-- latest count: xw, xt, xu, xtt, xtu, xuu; a: how long it has measured,
-- at most the window). What the line does not explain is the counts'
-- noise, σ. The margin is FLUCTUATION σ (a count that reads high by its
-- noise), and, when the rate is above DRAIN_SIGNIFICANCE standard errors of
-- the fit, the part above them over DRAIN_HORIZON ms plus the count's age
-- (at most the rate's age while that is below the window); with nothing
-- draining the second part is zero. The reservations already waiting are
-- postponed by later lowerings instead (p, above): a margin for the drain
-- over the wait promised to the latest one (an earlier version) cost
-- throughput for as long as the queue was deep. A fit, not a running mean of the
-- shrinks: a mean of shrinks is the first count's error over the time
-- since, and the first counts (the fleet's first burst landing in another
-- order than it was reserved) are the noisiest, so the rate stayed low
-- for seconds (0.75 of a unit a ms for a drain of 1 after 5 s, 2.5-5.5 %
-- 429s in the foreign-traffic runs); and the mean square of the shrinks
-- took a steady drain itself for noise.
-- The rate is never clamped: clamping noise at zero makes a drift. A lower
-- level, never a lower rate, so a busy limit loses no throughput to it.
-- src/limiter/drain.rs is the embedded store's copy.
local DRAIN_WINDOW, DRAIN_HORIZON, DRAIN_SIGNIFICANCE = 4000, 1000, 2
local FLUCTUATION = 1
local function margin_below(index, seen, counted, refused)
  local state = redis.call('HMGET', KEYS[index], 'c', 'm', 'a', 'xw', 'xt', 'xu', 'xtt', 'xtu', 'xuu')
  local last, left = tonumber(state[1]), tonumber(state[2]) or 0
  local age = tonumber(state[3]) or 0
  local w, t, u = tonumber(state[4]) or 0, tonumber(state[5]) or 0, tonumber(state[6]) or 0
  local tt, tu, uu = tonumber(state[7]) or 0, tonumber(state[8]) or 0, tonumber(state[9]) or 0
  if last and now >= last then
    local elapsed = now - last
    -- A refused call keeps its charge here; if the provider did not charge
    -- it, the gap grows by that much at once: no drain, and not negative
    -- drain either (taken as such it cancelled what other traffic drains,
    -- and the margin stayed at zero while the 429s went on).
    local shrank = left + refused - (seen - level[index])
    -- The unseen drain so far is a line in time; its slope is the rate.
    -- The sums of an exponentially weighted least-squares fit are kept
    -- about the latest count (time 0, drain 0), so they stay small: move
    -- the origin to the new count, forget by the window, add it.
    local x, y = elapsed, shrank
    tt = tt - 2 * x * t + x * x * w
    tu = tu - x * u - y * t + x * y * w
    uu = uu - 2 * y * u + y * y * w
    t = t - x * w
    u = u - y * w
    local kept = math.exp(-elapsed / DRAIN_WINDOW)
    w, t, u, tt, tu, uu = w * kept + 1, t * kept, u * kept, tt * kept, tu * kept, uu * kept
    age = math.min(DRAIN_WINDOW, age + elapsed)
  elseif not last then
    w = 1
  end
  local function exact(value)
    return string.format('%.17g', value)
  end
  redis.call('HSET', KEYS[index], 'a', exact(age), 'xw', exact(w), 'xt', exact(t),
    'xu', exact(u), 'xtt', exact(tt), 'xtu', exact(tu), 'xuu', exact(uu))
  -- The fields are written with the bucket, which also sets their expiry.
  delta[index] = delta[index] or 0
  -- A line through two counts has no noise to measure.
  local sxx = tt - t * t / w
  if w <= 2 or sxx <= 0 then
    return seen
  end
  local sxy, syy = tu - t * u / w, uu - u * u / w
  local drain = sxy / sxx
  -- What the line does not explain is the counts' own noise.
  local noise = math.sqrt(math.max(0, syy - drain * sxy) / (w - 2))
  local fluctuation = math.floor(FLUCTUATION * noise)
  local significant = drain - DRAIN_SIGNIFICANCE * noise / math.sqrt(sxx)
  if significant <= 0 then
    return seen - fluctuation
  end
  -- The sidecar added the refill since the count at the configured rate:
  -- the drain took its share of that too. (The reservations already
  -- waiting are not covered here: each later lowering postpones them by
  -- what it took, p below.) But while the rate has been measured for less
  -- than its window, it predicts no further ahead than it was measured: a
  -- few ms of answers arriving together, a few ms.
  local ahead = DRAIN_HORIZON + math.max(0, counted)
  if age < DRAIN_WINDOW then
    ahead = math.min(ahead, age)
  end
  return seen - math.floor(significant * ahead) - fluctuation
end

local replies = {{1}}
local at = 4 * #KEYS + 1
for _ = 1, count do
  local kind = ARGV[at]
  local reply
  if kind == 'a' then
    local max_wait, n = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    local first = at + 3
    -- never_draw: the first draw that no wait can cover.
    local longest, longest_draw, never_draw = 0, 1, nil
    for draw = 1, n do
      local base = first + 3 * (draw - 1)
      local index = tonumber(ARGV[base])
      local cost, floor = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
      touch(index)
      if cost + floor > largest[index] then
        reply = {-1, draw}
        break
      end
      local missing = math.min(cost + floor, capacity[index]) - level[index]
      local wait = 0
      if missing > 0 then
        if rate[index] > 0 then
          wait = ceil_div(missing, rate[index])
        else
          never_draw = never_draw or draw
        end
      end
      if wait > longest then
        longest, longest_draw = wait, draw
      end
    end
    if reply == nil then
      if never_draw then
        reply = {0, NEVER, never_draw}
      elseif longest > max_wait then
        reply = {0, longest - max_wait, longest_draw}
      else
        local slot = math.floor(now / HISTORY_SLOT)
        for draw = 1, n do
          local base = first + 3 * (draw - 1)
          local index = tonumber(ARGV[base])
          if history[index] ~= nil and history[index] ~= slot then
            redis.call('HSET', KEYS[index], 'h' .. (slot % HISTORY_SLOTS),
              string.format('%d:%d', slot, drawn[index]))
            history[index] = slot
          end
          local cost = tonumber(ARGV[base + 1])
          drawn[index] = drawn[index] + cost
          add(index, -cost)
        end
        reply = {1, longest}
        for draw = 1, n do
          local index = tonumber(ARGV[first + 3 * (draw - 1)])
          reply[draw + 2] = drawn[index]
          reply[n + draw + 2] = lowered[index]
        end
      end
    end
    at = first + 3 * n
  elseif kind == 'c' then
    local n = tonumber(ARGV[at + 1])
    for change = 1, n do
      local base = at + 2 + 5 * (change - 1)
      local index = tonumber(ARGV[base])
      own[index] = {tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])}
      keep[index] = tonumber(ARGV[base + 4])
      in_force(index)
      if my_slot[index] then
        my_slot[index][2] = true
      end
    end
    at = at + 2 + 5 * n
  else
    local n = tonumber(ARGV[at + 1])
    local stride, clips = 2, {}
    if kind == 'l' then
      stride = 7
    end
    for change = 1, n do
      local base = at + 2 + stride * (change - 1)
      local index = tonumber(ARGV[base])
      touch(index)
      local units = tonumber(ARGV[base + 1])
      if kind == 'l' then
        local reported, since = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
        local counted, mark = tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5])
        local refused = tonumber(ARGV[base + 6])
        -- The provider's count less what the fleet drew that it had not seen.
        local seen
        if reported >= 0 and mark >= 0 then
          -- A count below the mark started again (the bucket expired): unknown.
          if drawn[index] >= mark then
            seen = reported - (drawn[index] - mark)
          end
          if history[index] == nil then
            history[index] = -1
          end
        elseif reported >= 0 and history[index] == nil then
          -- Keep a history from now on (written with the bucket).
          history[index] = -1
          delta[index] = delta[index] or 0
        elseif since >= 0 then
          -- The sidecar noted the reservation up to a few ms after Redis
          -- made it (and counts whole ms): look a little earlier, where
          -- an entry only counts more; else in the slot of the time named
          -- (the reservation's own, which has one); else one slot before.
          local named = now - since
          local early = math.floor((named - NOTE_LAG) / HISTORY_SLOT)
          for _, slot in ipairs({early, math.floor(named / HISTORY_SLOT), early - 1}) do
            local entry = redis.call('HGET', KEYS[index], 'h' .. (slot % HISTORY_SLOTS))
            local at_slot, then_drawn = string.match(entry or '', '^(%-?%d+):(%d+)$')
            if at_slot and tonumber(at_slot) == slot then
              seen = reported - (drawn[index] - tonumber(then_drawn))
              break
            end
          end
        end
        if seen then
          units = math.min(units, margin_below(index, seen, counted, refused))
        end
        -- Only ever down, to the level asked for.
        local down = units - level[index]
        if down < 0 then
          add(index, down)
          -- The reservations waiting are postponed by it too, as far as
          -- the provider had room (see "Reservations already promised").
          if seen then
            local room = capacity[index] - (reported - counted * rate[index])
            local postponed = math.min(-down, math.max(0, room))
            if postponed > 0 then
              lowered[index] = lowered[index] + postponed
              lowered_now[index] = true
            end
          end
        end
        if seen then
          redis.call('HSET', KEYS[index], 'c', string.format('%d', now),
            'm', string.format('%d', seen - level[index]))
        end
      elseif units < 0 then
        -- An overrun: taken within the bucket's overrun debt; what is
        -- left untaken is answered (change number, units). It counts in
        -- n as it is taken (below).
        local clipped = take_overrun(index, -units)
        if clipped > 0 then
          clips[#clips + 1] = change
          clips[#clips + 1] = clipped
        end
        drawn[index] = drawn[index] - units - clipped
      else
        add(index, units)
        -- n counts what the bucket is charged for: a refund (a report
        -- below the reservation) takes back from it, an overrun adds, so
        -- that what the fleet drew after a mark is what the provider will
        -- be charged for, not what was reserved.
        drawn[index] = math.max(0, drawn[index] - units)
      end
    end
    if kind == 'l' then
      reply = {3}
      for change = 1, n do
        reply[change + 1] = lowered[tonumber(ARGV[at + 2 + stride * (change - 1)])]
      end
    else
      reply = {2}
      for _, value in ipairs(clips) do
        reply[#reply + 1] = value
      end
    end
    at = at + 2 + stride * n
  end
  if reply then
    replies[#replies + 1] = reply
  end
end

local changes = {}
for index, units in pairs(delta) do
  -- Written under the capacity in force at the end ("c" may have changed it).
  rebase(index)
  write_bucket(KEYS[index], level[index], updated[index], capacity[index], rate[index],
    keep[index], now, drawn[index], history[index])
  -- A full bucket was deleted: it carries no shape either.
  local slot = my_slot[index]
  if slot and slot[2] and level[index] < capacity[index] then
    local mine = own[index]
    redis.call('HSET', KEYS[index], slot[1], string.format('%s:%d:%d:%d:%d',
      sidecar, mine[1], mine[2], mine[3], now))
  end
  -- (p goes with the bucket: a full one deleted has no queue to move.)
  if lowered_now[index] and (level[index] < capacity[index] or history[index]) then
    redis.call('HSET', KEYS[index], 'p', string.format('%d', lowered[index]))
  end
  -- (A full bucket owes nothing: deleted, or kept for its history with a
  -- debt of 0.)
  if overrun[index] ~= nil and (level[index] < capacity[index] or history[index]) then
    local debt = overrun[index]
    if level[index] >= capacity[index] then
      debt = 0
    end
    redis.call('HSET', KEYS[index], 'o', string.format('%d:%d', debt, now))
  end
  if units ~= 0 then
    changes[#changes + 1] = index .. ':' .. string.format('%d', units)
  end
end
for index = 2, #KEYS do
  local theirs = other[index]
  if theirs then
    local status = replies[1]
    status[#status + 1] = index
    status[#status + 1] = theirs[1]
    status[#status + 1] = theirs[2]
  end
end
-- The record: replies and deltas in msgpack, packed in C at once (integers
-- exactly, as int64); formatting each reply as text in Lua cost a fifth of
-- the script's time.
redis.call('SET', record, cmsgpack.pack(replies, table.concat(changes, ',')), 'PX', ttl)
return replies
