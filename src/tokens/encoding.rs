//! Which tiktoken encoding a model uses, and the encoders themselves, each
//! built once per process and shared.
//!
//! The family table follows tiktoken's own `model.py` as mirrored by
//! tiktoken-rs 0.12 (`tokenizer.rs`): o200k_base for gpt-4o, gpt-4.1,
//! gpt-4.5, gpt-5, the o-series and codex-mini; cl100k_base for gpt-4,
//! gpt-3.5-turbo and the embedding models. It differs on purpose in three
//! places, each tested: an unknown OpenAI-looking name (`gpt-6`, `o5-pro`,
//! `o4`) takes o200k_base, the newest encoding, where tiktoken-rs gives up;
//! `gpt-oss-*` takes o200k_base, whose ordinary-text tokens are the ones
//! of o200k_harmony; and the retired GPT-3 / Codex models (p50k, r50k) get no
//! encoding, so they fall back to the character estimator.
//!
//! Cost of an encoder (measured by `examples/bench_tokens.rs` on the 2-vCPU
//! development VM, release build, fresh process; `bench/tokens/README.md`):
//! o200k_base takes 0.16–0.22 s to build and adds 45 MiB of resident memory
//! (52 MiB at peak while building), cl100k_base 0.08–0.10 s and 24 MiB, both
//! together 0.2–0.34 s and 69 MiB. Nothing is built until [`preload`] or the
//! first count asks for it.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tiktoken_rs::CoreBPE;

use super::TokenError;

/// A tiktoken encoding this crate can count with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Encoding {
    /// gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o1, o3, o4-mini and their snapshots.
    O200kBase,
    /// gpt-4, gpt-4-turbo, gpt-3.5-turbo, text-embedding-3-*.
    Cl100kBase,
}

impl Encoding {
    /// Every encoding, in a fixed order.
    pub const ALL: [Encoding; 2] = [Encoding::O200kBase, Encoding::Cl100kBase];

    /// The encoding's name as tiktoken spells it, e.g. `"o200k_base"`.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }

    /// The encoding called `name` (`"o200k_base"` or `"cl100k_base"`).
    pub fn from_name(name: &str) -> Option<Encoding> {
        Encoding::ALL.into_iter().find(|e| e.name() == name)
    }

    /// Whether this process has built the encoder already.
    pub fn is_loaded(self) -> bool {
        self.cell().get().is_some()
    }

    /// The shared encoder, built on first use (a quarter of a second for
    /// o200k_base; call [`preload`] at start-up to keep that off the request
    /// path).
    pub(crate) fn encoder(self) -> Result<&'static CoreBPE, TokenError> {
        let built = self.cell().get_or_init(|| {
            let built = match self {
                Encoding::O200kBase => tiktoken_rs::o200k_base(),
                Encoding::Cl100kBase => tiktoken_rs::cl100k_base(),
            };
            // The ranks are compiled into the binary, so this fails only for
            // a broken build; keep the reason rather than panicking.
            built.map_err(|error| error.to_string())
        });
        built
            .as_ref()
            .map_err(|reason| TokenError::EncoderUnavailable {
                encoding: self,
                reason: reason.clone(),
            })
    }

    fn cell(self) -> &'static OnceLock<Result<CoreBPE, String>> {
        static O200K_BASE: OnceLock<Result<CoreBPE, String>> = OnceLock::new();
        static CL100K_BASE: OnceLock<Result<CoreBPE, String>> = OnceLock::new();
        match self {
            Encoding::O200kBase => &O200K_BASE,
            Encoding::Cl100kBase => &CL100K_BASE,
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The encoding of an OpenAI model, or `None` for a model without a public
/// tokenizer (Anthropic, Gemini, local models, retired GPT-3 models), which
/// the character estimator must count.
///
/// Case-insensitive; a fine-tuned name (`ft:gpt-4o-mini:org::id`) takes its
/// base model's encoding; an unknown name that looks like OpenAI's (`gpt-*`,
/// `chatgpt-*`, `o<digits>`) takes o200k_base.
pub fn encoding_for_model(model: &str) -> Option<Encoding> {
    let model = model.trim().to_ascii_lowercase();
    let model = match model.strip_prefix("ft:") {
        Some(rest) => rest.split(':').next().unwrap_or(rest).to_string(),
        None => model,
    };
    let model = model.as_str();

    // Snapshots and variants extend a family name with `-…`, `.…` or `_…`
    // (`gpt-4o-2024-08-06`, `gpt-5.2`, `gpt-3.5-turbo-16k`).
    let family = |name: &str| {
        model
            .strip_prefix(name)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.', '_']))
    };
    // Order matters: `gpt-4o` and `gpt-4.1` before `gpt-4`.
    const O200K: &[&str] = &[
        "gpt-4o",
        "chatgpt-4o",
        "gpt-4.1",
        "gpt-4.5",
        "gpt-5",
        "gpt-oss",
        "codex-mini",
        "computer-use-preview",
    ];
    const CL100K: &[&str] = &[
        "gpt-4",
        "gpt-3.5-turbo",
        "gpt-3.5",
        "gpt-35-turbo",
        "text-embedding-3-small",
        "text-embedding-3-large",
        "text-embedding-ada-002",
        "davinci-002",
        "babbage-002",
    ];
    if O200K.iter().any(|name| family(name)) || is_o_series(model) {
        return Some(Encoding::O200kBase);
    }
    if CL100K.iter().any(|name| family(name)) {
        return Some(Encoding::Cl100kBase);
    }
    // Newer OpenAI models all use o200k_base; assume the next ones do too.
    if model.starts_with("gpt-") || model.starts_with("chatgpt-") {
        return Some(Encoding::O200kBase);
    }
    None
}

/// `o1`, `o3-mini`, `o4-mini-2025-04-16`, `o5`: the letter o, digits, then
/// nothing or a `-` suffix.
fn is_o_series(model: &str) -> bool {
    let Some(rest) = model.strip_prefix('o') else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && (rest.len() == digits || rest.as_bytes()[digits] == b'-')
}

/// The set of encodings needed to count for these models: what [`preload`]
/// builds. Models without an encoding contribute nothing.
pub fn encodings_for_models<'a>(models: impl IntoIterator<Item = &'a str>) -> BTreeSet<Encoding> {
    models.into_iter().filter_map(encoding_for_model).collect()
}

/// One encoder made ready by [`preload`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preloaded {
    /// The encoding now built.
    pub encoding: Encoding,
    /// Time spent building it; zero when it was already built.
    pub build_time: Duration,
}

/// Builds exactly the encoders these models need (and no other), so the
/// first request does not pay for it. Call it at start-up and on reload with
/// every configured model; encoders already built are not built again.
pub fn preload<'a>(
    models: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<Preloaded>, TokenError> {
    preload_encodings(encodings_for_models(models))
}

/// [`preload`] for encodings named directly (a limit's `tokenizer`
/// override rather than its model).
pub fn preload_encodings(
    encodings: impl IntoIterator<Item = Encoding>,
) -> Result<Vec<Preloaded>, TokenError> {
    encodings
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|encoding| {
            let started = Instant::now();
            let was_loaded = encoding.is_loaded();
            encoding.encoder()?;
            Ok(Preloaded {
                encoding,
                build_time: if was_loaded {
                    Duration::ZERO
                } else {
                    started.elapsed()
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_families_map_to_their_encoding() {
        use Encoding::*;
        let cases: &[(&str, Option<Encoding>)] = &[
            ("gpt-4o", Some(O200kBase)),
            ("gpt-4o-mini", Some(O200kBase)),
            ("gpt-4o-2024-08-06", Some(O200kBase)),
            ("chatgpt-4o-latest", Some(O200kBase)),
            ("gpt-4.1", Some(O200kBase)),
            ("gpt-4.1-nano-2025-04-14", Some(O200kBase)),
            ("gpt-4.5-preview", Some(O200kBase)),
            ("gpt-5", Some(O200kBase)),
            ("gpt-5.2-codex", Some(O200kBase)),
            ("o1", Some(O200kBase)),
            ("o1-mini", Some(O200kBase)),
            ("o3", Some(O200kBase)),
            ("o3-pro", Some(O200kBase)),
            ("o4-mini-2025-04-16", Some(O200kBase)),
            ("o4", Some(O200kBase)),
            ("gpt-oss-120b", Some(O200kBase)),
            ("GPT-4O", Some(O200kBase)),
            ("ft:gpt-4o-mini-2024-07-18:acme::abc123", Some(O200kBase)),
            ("gpt-4", Some(Cl100kBase)),
            ("gpt-4-0613", Some(Cl100kBase)),
            ("gpt-4-turbo", Some(Cl100kBase)),
            ("gpt-4-32k", Some(Cl100kBase)),
            ("gpt-3.5-turbo", Some(Cl100kBase)),
            ("gpt-3.5-turbo-0125", Some(Cl100kBase)),
            ("gpt-35-turbo", Some(Cl100kBase)),
            ("text-embedding-3-small", Some(Cl100kBase)),
            ("ft:gpt-3.5-turbo:acme:x:1", Some(Cl100kBase)),
            // Unknown, but OpenAI-looking: the newest encoding.
            ("gpt-6", Some(O200kBase)),
            ("o5-pro", Some(O200kBase)),
            // No public tokenizer.
            ("claude-sonnet-4-5", None),
            ("gemini-2.5-pro", None),
            ("llama-3.1-70b", None),
            ("text-davinci-003", None),
            ("omni", None),
            ("o", None),
            ("", None),
        ];
        for &(model, expected) in cases {
            assert_eq!(encoding_for_model(model), expected, "{model}");
        }
    }

    #[test]
    fn encodings_for_models_is_the_needed_set() {
        let needed = encodings_for_models(["gpt-4o", "gpt-4o-mini", "claude-3-haiku"]);
        assert_eq!(needed, BTreeSet::from([Encoding::O200kBase]));
        let needed = encodings_for_models(["gpt-4", "o3"]);
        assert_eq!(
            needed,
            BTreeSet::from([Encoding::O200kBase, Encoding::Cl100kBase])
        );
        assert!(encodings_for_models(["claude-opus-4"]).is_empty());
    }

    #[test]
    fn encoding_names_round_trip() {
        for encoding in Encoding::ALL {
            assert_eq!(Encoding::from_name(encoding.name()), Some(encoding));
        }
        assert_eq!(Encoding::from_name("p50k_base"), None);
    }
}
