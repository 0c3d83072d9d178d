//! A learned default for max output tokens: a high percentile of the
//! completion tokens recently reported for each model.
//!
//! When a request names no max output tokens, reserving the model's whole
//! output ceiling (16k, 32k, 100k tokens) starves the bucket, and a small
//! fixed default under-reserves the long answers. The completion sizes an
//! application actually gets are narrow per model and prompt template, so
//! the p95 of the last few hundred reports is a far tighter reservation that
//! is still exceeded by only about one request in twenty; settlement debits
//! that overrun (where the provider's accounting allows it).
//!
//! In memory, per sidecar, off by default; the dispatcher decides when to
//! consult it (a messages cost that names no maximum, on a limit with
//! `learn_max_output`) and caps what it returns at the limit's
//! `max_request_tokens`.
//! Memory is bounded: `window` samples per model and at most `max_models`
//! models (reports for further models are ignored).

use std::collections::{HashMap, VecDeque};

use super::TokenError;

/// Settings of an [`OutputTokenLearner`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnerSettings {
    /// Reports kept per model; the oldest is dropped when a new one arrives.
    pub window: usize,
    /// Reports needed before an estimate is given.
    pub min_samples: usize,
    /// Percentile returned, in (0, 100].
    pub percentile: f64,
    /// Models tracked at most.
    pub max_models: usize,
}

impl LearnerSettings {
    /// Largest `window` accepted.
    pub const MAX_WINDOW: usize = 100_000;
    /// Largest `max_models` accepted.
    pub const MAX_MODELS: usize = 10_000;

    /// Checks the settings, naming the first one out of range.
    pub fn validate(&self) -> Result<(), TokenError> {
        let invalid = |parameter: &'static str, value: String, expected: String| {
            Err(TokenError::InvalidEstimator {
                parameter,
                value,
                expected,
            })
        };
        if !(1..=Self::MAX_WINDOW).contains(&self.window) {
            return invalid(
                "window",
                self.window.to_string(),
                format!("from 1 to {}", Self::MAX_WINDOW),
            );
        }
        if !(1..=self.window).contains(&self.min_samples) {
            return invalid(
                "min_samples",
                self.min_samples.to_string(),
                format!("from 1 to window ({})", self.window),
            );
        }
        if !(self.percentile.is_finite() && self.percentile > 0.0 && self.percentile <= 100.0) {
            return invalid(
                "percentile",
                self.percentile.to_string(),
                "above 0 and at most 100".to_string(),
            );
        }
        if !(1..=Self::MAX_MODELS).contains(&self.max_models) {
            return invalid(
                "max_models",
                self.max_models.to_string(),
                format!("from 1 to {}", Self::MAX_MODELS),
            );
        }
        Ok(())
    }
}

impl Default for LearnerSettings {
    /// p95 of the last 500 reports, used from the 50th on, for up to 256 models.
    fn default() -> Self {
        LearnerSettings {
            window: 500,
            min_samples: 50,
            percentile: 95.0,
            max_models: 256,
        }
    }
}

/// Recent completion-token counts per model and their high percentile.
#[derive(Debug, Clone)]
pub struct OutputTokenLearner {
    settings: LearnerSettings,
    models: HashMap<String, Samples>,
}

#[derive(Debug, Clone, Default)]
struct Samples {
    recent: VecDeque<u64>,
    /// The percentile of `recent`, recomputed on each report once there are
    /// `min_samples`, so that [`OutputTokenLearner::estimate`] is a lookup.
    estimate: Option<u64>,
}

impl OutputTokenLearner {
    /// A learner with validated settings.
    pub fn new(settings: LearnerSettings) -> Result<OutputTokenLearner, TokenError> {
        settings.validate()?;
        Ok(OutputTokenLearner {
            settings,
            models: HashMap::new(),
        })
    }

    /// The settings in force.
    pub fn settings(&self) -> &LearnerSettings {
        &self.settings
    }

    /// Records the completion tokens one request to `model` used. Returns
    /// false when the report was ignored because `max_models` other models
    /// are already tracked.
    pub fn record(&mut self, model: &str, completion_tokens: u64) -> bool {
        let settings = self.settings;
        if let Some(samples) = self.models.get_mut(model) {
            samples.push(&settings, completion_tokens);
            return true;
        }
        if self.models.len() >= settings.max_models {
            return false;
        }
        let mut samples = Samples::default();
        samples.push(&settings, completion_tokens);
        self.models.insert(model.to_string(), samples);
        true
    }

    /// The configured percentile of `model`'s recent completion tokens, or
    /// `None` until `min_samples` reports have arrived.
    pub fn estimate(&self, model: &str) -> Option<u64> {
        self.models.get(model).and_then(|samples| samples.estimate)
    }

    /// Reports currently held for `model`.
    pub fn samples(&self, model: &str) -> usize {
        self.models
            .get(model)
            .map_or(0, |samples| samples.recent.len())
    }
}

impl Default for OutputTokenLearner {
    /// A learner with [`LearnerSettings::default`].
    fn default() -> Self {
        OutputTokenLearner {
            settings: LearnerSettings::default(),
            models: HashMap::new(),
        }
    }
}

impl Samples {
    fn push(&mut self, settings: &LearnerSettings, completion_tokens: u64) {
        if self.recent.len() == settings.window {
            self.recent.pop_front();
        }
        self.recent.push_back(completion_tokens);
        if self.recent.len() >= settings.min_samples {
            self.estimate = Some(percentile(&self.recent, settings.percentile));
        }
    }
}

/// Nearest-rank percentile: the smallest sample with at least `p` % of the
/// samples at or below it. Never interpolates, so the answer is always a
/// count that was really reported. `samples` must not be empty.
fn percentile(samples: &VecDeque<u64>, p: f64) -> u64 {
    let mut sorted: Vec<u64> = samples.iter().copied().collect();
    let n = sorted.len();
    // rank = ⌈p/100 · n⌉ in 1..=n; p is in (0, 100].
    let rank = ((p / 100.0) * n as f64).ceil().clamp(1.0, n as f64) as usize;
    let (_, value, _) = sorted.select_nth_unstable(rank - 1);
    *value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learner(window: usize, min_samples: usize, percentile: f64) -> OutputTokenLearner {
        OutputTokenLearner::new(LearnerSettings {
            window,
            min_samples,
            percentile,
            max_models: 4,
        })
        .unwrap()
    }

    #[test]
    fn nearest_rank_percentiles() {
        // (samples, percentile) → value
        let cases: &[(&[u64], f64, u64)] = &[
            (&[7], 95.0, 7),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 95.0, 10),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90.0, 9),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 50.0, 5),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 100.0, 10),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.1, 1),
            (&[10, 1, 9, 2, 8, 3, 7, 4, 6, 5], 50.0, 5),
        ];
        for &(samples, p, expected) in cases {
            let samples: VecDeque<u64> = samples.iter().copied().collect();
            assert_eq!(percentile(&samples, p), expected, "{samples:?} p{p}");
        }
        // p95 of 1..=100 is 95, of 1..=1000 is 950.
        let hundred: VecDeque<u64> = (1..=100).collect();
        assert_eq!(percentile(&hundred, 95.0), 95);
        let thousand: VecDeque<u64> = (1..=1000).rev().collect();
        assert_eq!(percentile(&thousand, 95.0), 950);
    }

    #[test]
    fn no_estimate_before_min_samples() {
        let mut learner = learner(10, 3, 95.0);
        assert_eq!(learner.estimate("m"), None);
        learner.record("m", 100);
        learner.record("m", 200);
        assert_eq!(learner.estimate("m"), None);
        learner.record("m", 300);
        assert_eq!(learner.estimate("m"), Some(300));
    }

    #[test]
    fn window_slides_and_forgets_old_reports() {
        let mut learner = learner(4, 1, 100.0);
        for tokens in [1_000, 10, 20, 30] {
            learner.record("m", tokens);
        }
        assert_eq!(learner.estimate("m"), Some(1_000));
        learner.record("m", 40); // pushes 1_000 out
        assert_eq!(learner.samples("m"), 4);
        assert_eq!(learner.estimate("m"), Some(40));
    }

    #[test]
    fn models_are_learned_separately_and_bounded() {
        let mut learner = learner(10, 1, 95.0);
        assert!(learner.record("small", 50));
        assert!(learner.record("large", 5_000));
        assert_eq!(learner.estimate("small"), Some(50));
        assert_eq!(learner.estimate("large"), Some(5_000));
        assert!(learner.record("c", 1));
        assert!(learner.record("d", 1));
        // max_models = 4: a fifth model is ignored, known ones still learn.
        assert!(!learner.record("e", 1));
        assert_eq!(learner.estimate("e"), None);
        assert!(learner.record("small", 60));
        assert_eq!(learner.samples("small"), 2);
    }

    #[test]
    fn p95_ignores_rare_outliers_but_not_frequent_ones() {
        let mut learner = learner(100, 20, 95.0);
        // 96 answers of ~300 tokens, 4 runaway answers of 4_000.
        for i in 0..100u64 {
            learner.record("m", if i % 25 == 0 { 4_000 } else { 250 + i });
        }
        let estimate = learner.estimate("m").unwrap();
        assert!((300..4_000).contains(&estimate), "{estimate}");
        // Once one answer in ten runs long, p95 follows them.
        for i in 0..100u64 {
            learner.record("m", if i % 10 == 0 { 4_000 } else { 300 });
        }
        assert_eq!(learner.estimate("m"), Some(4_000));
    }

    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let valid = LearnerSettings::default();
        assert!(valid.validate().is_ok());
        let cases = [
            (LearnerSettings { window: 0, ..valid }, "window"),
            (
                LearnerSettings {
                    window: LearnerSettings::MAX_WINDOW + 1,
                    ..valid
                },
                "window",
            ),
            (
                LearnerSettings {
                    min_samples: 0,
                    ..valid
                },
                "min_samples",
            ),
            (
                LearnerSettings {
                    min_samples: valid.window + 1,
                    ..valid
                },
                "min_samples",
            ),
            (
                LearnerSettings {
                    percentile: 0.0,
                    ..valid
                },
                "percentile",
            ),
            (
                LearnerSettings {
                    percentile: 100.5,
                    ..valid
                },
                "percentile",
            ),
            (
                LearnerSettings {
                    percentile: f64::NAN,
                    ..valid
                },
                "percentile",
            ),
            (
                LearnerSettings {
                    max_models: 0,
                    ..valid
                },
                "max_models",
            ),
        ];
        for (settings, name) in cases {
            match OutputTokenLearner::new(settings) {
                Err(TokenError::InvalidEstimator { parameter, .. }) => {
                    assert_eq!(parameter, name, "{settings:?}")
                }
                other => panic!("{settings:?}: expected an error, got {other:?}"),
            }
        }
    }
}
