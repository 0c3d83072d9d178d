//! The margin a provider correction leaves below the provider's view, for
//! what drains the provider unseen between two corrections (another
//! application on the same API key, a provider slower than configured).
//!
//! The embedded store's copy of `margin_below` in `lua/batch.lua`, which the
//! Redis store runs; the arithmetic is the same, in the bucket's units.
//! Between corrections the gap between the provider's view and the bucket
//! shrinks by that drain; each correction measures how much it shrank since
//! the last. The shrinks added up are the unseen drain so far: a line in
//! time, plus each count's noise. The rate is the line's slope, fitted by
//! exponentially weighted least squares; what the line does not explain is
//! the counts' noise. The provider's counts are noisy (requests land in a
//! different order than they were reserved, history slots are coarse), and
//! a rate estimated from noise alone must stay at zero, or the limit would
//! be held below the provider for nothing: only the part of the rate above
//! its standard errors counts. The estimate itself is never clamped:
//! clamping each step at zero turns noise into a positive drift. The margin
//! is a lower level, never a lower rate, so it costs no throughput once the
//! limit is busy.
//!
//! A fit rather than a running mean of the shrinks (the first version): a
//! mean of shrinks is the first count's error over the time since, and the
//! first counts (a fleet's first burst, landing in another order than it
//! was reserved) are the noisiest. In issue 26's foreign-traffic runs the
//! mean read 0.75 of a unit a ms for a drain of 1 five seconds in, and the
//! mean square of the shrinks, taken for their noise, counted a steady
//! drain itself as noise.

/// How long the fit remembers a count: its weight falls by e each window, ms.
pub const DRAIN_WINDOW_MS: f64 = 4000.0;
/// How far ahead the margin covers the drain, ms.
pub const DRAIN_HORIZON_MS: f64 = 1000.0;
/// How many standard errors of the rate a drain must exceed to count.
pub const DRAIN_SIGNIFICANCE: f64 = 2.0;
/// How many standard deviations of a count's noise the margin also keeps:
/// a count that reads high by its noise must not hand out what the
/// provider does not have. A level, so it costs no throughput either.
pub const FLUCTUATION: f64 = 1.0;

/// The sums of an exponentially weighted least-squares fit of the unseen
/// drain (units) against time (ms), about the latest count: it is at time
/// 0 and drain 0, earlier ones at negative times, so the sums stay small
/// however long the bucket lives.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Fit {
    /// The counts' weights.
    w: f64,
    /// Weighted times.
    t: f64,
    /// Weighted drains.
    u: f64,
    tt: f64,
    tu: f64,
    uu: f64,
}

impl Fit {
    /// Adds a count `elapsed_ms` after the latest, the drain `shrank` units
    /// more: moves the origin to it, forgets by the window, weighs it 1.
    fn add(&mut self, elapsed_ms: f64, shrank: f64) {
        let (x, y) = (elapsed_ms, shrank);
        let Fit {
            w,
            t,
            u,
            tt,
            tu,
            uu,
        } = *self;
        let kept = (-elapsed_ms / DRAIN_WINDOW_MS).exp();
        *self = Fit {
            w: w * kept + 1.0,
            t: (t - x * w) * kept,
            u: (u - y * w) * kept,
            tt: (tt - 2.0 * x * t + x * x * w) * kept,
            tu: (tu - x * u - y * t + x * y * w) * kept,
            uu: (uu - 2.0 * y * u + y * y * w) * kept,
        };
    }

    /// The slope (units per ms), the counts' noise (units) and the spread
    /// of their times (the slope's standard error is the noise over its
    /// root); None while a line through the counts leaves no noise to
    /// measure (two counts, or all at one time).
    fn line(&self) -> Option<(f64, f64, f64)> {
        let Fit {
            w,
            t,
            u,
            tt,
            tu,
            uu,
        } = *self;
        let sxx = tt - t * t / w;
        if w <= 2.0 || sxx <= 0.0 {
            return None;
        }
        let (sxy, syy) = (tu - t * u / w, uu - u * u / w);
        let slope = sxy / sxx;
        let noise = ((syy - slope * sxy).max(0.0) / (w - 2.0)).sqrt();
        Some((slope, noise, sxx))
    }
}

/// One bucket's drain estimate (all zero before its first correction).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Drain {
    /// When the last correction was made, ms.
    last_ms: Option<i64>,
    /// The gap the last correction left: the provider's view less the level.
    left: i64,
    /// The fit of the unseen drain so far.
    fit: Fit,
    /// How many ms the rate has been measured over, at most the window.
    age_ms: f64,
}

impl Drain {
    /// Corrects a bucket at `level` by the provider's view `seen` at `now_ms` (units), counted at most
    /// `counted_ms_ago`, when the answered call keeps `refused` units in the
    /// bucket after a 429 (the gap may grow by that much at once, which is
    /// no drain): the level it is lowered to (never above `level`).
    /// Updates the fit with the gap's shrinking and notes the gap left.
    pub fn correct(
        &mut self,
        seen: i64,
        level: i64,
        now_ms: i64,
        counted_ms_ago: i64,
        refused: i64,
    ) -> i64 {
        match self.last_ms {
            // Two counts in the same ms (one script call carries several)
            // measure no time, only how far apart they are; the fit takes
            // both, so that each count's error cancels against the next.
            Some(last) if now_ms >= last => {
                let elapsed = (now_ms - last) as f64;
                let shrank = self
                    .left
                    .saturating_add(refused)
                    .saturating_sub(seen.saturating_sub(level)) as f64;
                self.fit.add(elapsed, shrank);
                self.age_ms = (self.age_ms + elapsed).min(DRAIN_WINDOW_MS);
            }
            Some(_) => {}
            None => self.fit.w = 1.0,
        }
        let target = seen.saturating_sub(self.margin(counted_ms_ago));
        let lowered = level.min(target);
        self.last_ms = Some(now_ms);
        self.left = seen.saturating_sub(lowered);
        lowered
    }

    /// The units to stay below the provider's view: the counts' fluctuation,
    /// and the significant part of the rate over the horizon and over the
    /// refill the sidecar credited since the count at the configured rate
    /// (the drain took its share). (The reservations already waiting are
    /// not covered here: a later lowering postpones them, see
    /// [`super::lowered`].) But while the rate has been measured for
    /// less than its window, over no longer than it was measured: a rate
    /// from a few ms of answers arriving together predicts a few ms, not a
    /// second.
    fn margin(&self, counted_ms_ago: i64) -> i64 {
        self.drift(counted_ms_ago)
            .saturating_add(self.fluctuation())
    }

    /// The noise of one count: what the fitted line does not explain.
    fn noise(&self) -> f64 {
        self.fit.line().map_or(0.0, |(_, noise, _)| noise)
    }

    /// The part of the margin for a count that reads high by its noise.
    fn fluctuation(&self) -> i64 {
        (FLUCTUATION * self.noise()).floor() as i64
    }

    /// The part of the margin for the drain itself (see `margin`).
    fn drift(&self, counted_ms_ago: i64) -> i64 {
        let Some((slope, noise, spread)) = self.fit.line() else {
            return 0;
        };
        // As the Lua has it, to the last bit.
        let significant = slope - DRAIN_SIGNIFICANCE * noise / spread.sqrt();
        if significant <= 0.0 {
            return 0;
        }
        let mut ahead = DRAIN_HORIZON_MS + counted_ms_ago.max(0) as f64;
        if self.age_ms < DRAIN_WINDOW_MS {
            ahead = ahead.min(self.age_ms);
        }
        (significant * ahead).floor() as i64
    }

    /// The fitted rate, units per ms (0 before there is a line).
    #[cfg(test)]
    fn rate(&self) -> f64 {
        self.fit.line().map_or(0.0, |(slope, _, _)| slope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks a bucket the fleet draws at the provider's rate, corrected every
    /// 100 ms by a provider that `unseen` also drains each step, its count
    /// off by `noise(step)`; returns the margin left at the end.
    fn margin_after(unseen: i64, noise: impl Fn(i64) -> i64) -> i64 {
        let mut drain = Drain::default();
        let (mut level, mut provider) = (60_000i64, 60_000i64);
        let mut margin = 0;
        for step in 0..100 {
            let now = 1_000 + step * 100;
            provider -= unseen;
            let seen = provider + noise(step);
            level = drain.correct(seen, level, now, 0, 0);
            margin = provider - level;
        }
        margin
    }

    /// The same walk as `tests/it/redis_store.rs`'s drain test runs through the
    /// Lua: 2 units a ms unseen become about a second of margin. A steady
    /// drain is a line the fit explains: no noise, so no fluctuation margin
    /// (the mean square of the shrinks, 200/√2, was one).
    #[test]
    fn a_steady_unseen_drain_becomes_a_second_of_margin() {
        let margin = margin_after(200, |_| 0);
        assert!((1_900..=2_000).contains(&margin), "margin {margin}");
        assert_eq!(margin_after(0, |_| 0), 0);
    }

    /// Issue 26's foreign-traffic runs: a drain of a unit a ms, counted
    /// every 100 ms; the counts of the fleet's first second (its burst
    /// landing out of order) off by σ ≈ 1,500 units, the later ones by a
    /// request of the other application, σ ≈ 70. Returns the rate 5 s in.
    fn rate_after_a_noisy_first_second() -> f64 {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut uniform = move |half_width: i64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % (2 * half_width as u64 + 1)) as i64 - half_width
        };
        let mut drain = Drain::default();
        let (mut level, mut provider) = (-15_000i64, -15_000i64);
        for step in 0..50 {
            let now = 1_000 + step * 100;
            provider -= 100;
            // The sum of four uniform draws: close to normal.
            let half_width = if step < 10 { 1_300 } else { 60 };
            let noise = (0..4).map(|_| uniform(half_width)).sum::<i64>();
            level = drain.correct(provider + noise, level, now, 0, 0);
        }
        drain.rate()
    }

    /// The running mean of the shrinks it replaces read 0.94 here (its
    /// error is the first count's over the time since; 0.75 five seconds
    /// into the runs); the fit lets the later counts outweigh the first
    /// second's.
    #[test]
    fn the_first_counts_noise_does_not_hold_the_rate_down() {
        let rate = rate_after_a_noisy_first_second();
        assert!(
            (0.95..=1.05).contains(&rate),
            "rate {rate} for a drain of 1"
        );
    }

    /// A provider's count scattered by about a request's cost (σ ≈ 1,000
    /// units, from a fixed pseudo-random sequence), a correction every 25 ms
    /// for 20 s: returns the mean and the largest margin for the drift over the
    /// last 15 s, and the mean fluctuation margin.
    fn margins_through_noise(unseen_per_step: i64) -> (i64, i64, i64) {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut noise = move || {
            // The sum of four uniform draws of ±866: close to normal.
            (0..4)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % 1_733) as i64 - 866
                })
                .sum::<i64>()
        };
        let mut drain = Drain::default();
        let (mut level, mut provider) = (60_000i64, 60_000i64);
        let (mut sum, mut largest, mut fluctuation) = (0, 0, 0);
        for step in 0..800 {
            let now = 1_000 + step * 25;
            provider -= unseen_per_step;
            let seen = provider + noise();
            level = drain.correct(seen, level, now, 0, 0);
            if step >= 200 {
                let drift = drain.drift(0);
                sum += drift;
                largest = largest.max(drift);
                fluctuation += drain.fluctuation();
            }
        }
        (sum / 600, largest, fluctuation / 600)
    }

    /// Seen in issue 11's foreign-traffic runs: 429s in the second or two
    /// after the burst runs out. While the fleet draws some 30x the rate,
    /// its calls reach the provider in another order than they were
    /// reserved and each count is off by a request or two; once the burst
    /// is spent the counts are close again, but a scatter that still
    /// remembered the burst held the margin down while the queued
    /// reservations landed. A drain of a unit a ms, corrected every
    /// 25 ms, counts off by σ ≈ 3,000 units for 5 s and by σ ≈ 100 after:
    /// returns the margin that many ms after the counts came close.
    fn margin_after_a_noisy_burst(quiet_ms: i64) -> i64 {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = move |half_width: i64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % (2 * half_width as u64 + 1)) as i64 - half_width
        };
        let mut drain = Drain::default();
        let (mut level, mut provider) = (60_000i64, 60_000i64);
        let burst_steps = 200;
        for step in 0..burst_steps + quiet_ms / 25 {
            let now = 1_000 + step * 25;
            provider -= 25;
            // The sum of four uniform draws: close to normal.
            let half_width = if step < burst_steps { 2_600 } else { 87 };
            let noise = (0..4).map(|_| uniform(half_width)).sum::<i64>();
            level = drain.correct(provider + noise, level, now, 0, 0);
        }
        drain.margin(0)
    }

    #[test]
    fn the_margin_comes_back_soon_after_the_counts_come_close() {
        // The margin's goal: a second of a unit a ms. Averaging the scatter
        // over 16 corrections left 411 units as the burst ended and 853
        // a quarter of a second later.
        let at_the_end = margin_after_a_noisy_burst(0);
        let soon_after = margin_after_a_noisy_burst(250);
        assert!(
            at_the_end >= 600 && soon_after >= 1_000,
            "margin {at_the_end} as the burst ends, {soon_after} 250 ms later"
        );
    }

    /// What the first version got wrong (reverted after CI, where a
    /// run with no foreign traffic lost 4.5 % of its limit): with nothing
    /// draining, noisy counts must leave (almost) no margin. Clamping the
    /// rate at zero on every correction, without the significance test,
    /// turned this walk's noise into a mean margin of 938 units (at most
    /// 2,434). What noise does leave is the fluctuation margin, about the
    /// counts' σ: a level, not a lower rate.
    #[test]
    fn noise_alone_leaves_almost_no_margin_for_drift() {
        let (mean, largest, fluctuation) = margins_through_noise(0);
        assert!(
            mean <= 50 && largest <= 250 && (800..=1_200).contains(&fluctuation),
            "drift mean {mean}, largest {largest}; fluctuation {fluctuation}"
        );
    }

    /// A drain of a unit a ms (20 % of a 300k TPM limit) under that noise is
    /// still found, though the noise hides part of it.
    #[test]
    fn a_drain_above_the_noise_is_found_through_it() {
        let (mean, _, _) = margins_through_noise(25);
        assert!(mean >= 300, "mean {mean}");
    }

    /// Found in the 429s of issue 11's foreign-traffic run: one script
    /// call carries the counts of several answers, all in the same ms. The
    /// rate skipped such a count but kept the gap it left, so the error of
    /// the count before it stayed in the rate instead of cancelling against
    /// the next shrink. With nothing draining, each correction followed in
    /// its ms by a count 500 units higher must leave no margin below the
    /// lower count but the fluctuation of counts 500 apart, 500/√2 (the
    /// rate came out at 5 units a ms).
    #[test]
    fn counts_in_the_same_ms_make_no_rate_of_their_own() {
        let provider = 60_000i64;
        let mut drain = Drain::default();
        let mut level = provider;
        for step in 0..100 {
            let now = 1_000 + step * 100;
            for seen in [provider - 500, provider] {
                level = drain.correct(seen, level, now, 0, 0);
            }
        }
        let margin = provider - 500 - level;
        assert!(margin <= 354 + 50, "margin {margin}, rate {}", drain.rate());
    }

    /// Seen in a CI-like run with no foreign traffic: a fleet's first
    /// answers come back within a few ms of each other while the burst is
    /// being spent, each count a request's cost or so below the last. A
    /// rate measured over those few ms was carried over the whole horizon,
    /// and one correction lowered the bucket by 17 s of refill. A rate
    /// measured over `age` ms may predict no further ahead than that.
    #[test]
    fn a_rate_measured_over_a_few_ms_is_not_carried_over_a_second() {
        let mut drain = Drain::default();
        let (mut level, mut seen) = (300_000i64, 300_000i64);
        for now in 1_000..1_004 {
            seen -= 600;
            level = drain.correct(seen, level, now, 190, 0);
        }
        // Over 3 ms the gap shrank by 1,800 units: no more than that.
        assert!(seen - level <= 1_800, "margin {}", seen - level);
    }
}
