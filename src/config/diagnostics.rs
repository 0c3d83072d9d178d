//! Problems with a configuration file, each at its place: collecting them,
//! rendering them `FILE:LINE:COLUMN: CONTEXT: MESSAGE` in file order, and
//! the checks every section shares (integers in a range, names, duplicates).

use toml::Spanned;

use super::render::mask_redis_url;
use super::suggest::closest;
use crate::proto::MAX_NAME_LEN;

/// Collects located problems, then renders them `origin:line:col: message`
/// in file order.
pub(super) struct Diagnostics<'a> {
    text: &'a str,
    origin: &'a str,
    errors: Vec<(usize, String)>,
    /// (context, key) of keys dropped unread (`super::read`): a problem
    /// in that context naming that key only follows from the one reported.
    consequences: Vec<(String, String)>,
}

impl<'a> Diagnostics<'a> {
    /// No problems yet with `text`, named `origin` in messages.
    pub fn new(text: &'a str, origin: &'a str) -> Self {
        Diagnostics {
            text,
            origin,
            errors: Vec::new(),
            consequences: Vec::new(),
        }
    }

    /// Records a problem at byte `offset` of the text, unless it only
    /// follows from a key reported as unreadable.
    pub fn error(&mut self, offset: usize, message: String) {
        let follows = self
            .consequences
            .iter()
            .any(|(context, key)| names_key_in(&message, context, key));
        if !follows {
            self.errors.push((offset, message));
        }
    }

    /// Records a key (or value) that could not be read at byte `offset`.
    pub fn unreadable(&mut self, offset: usize, message: String) {
        self.errors.push((offset, message));
    }

    /// Drops, from now on, problems in `context` (e.g. `limits[2]`) that
    /// name `key`: it was reported unreadable, so "`key` is required" or
    /// "… is set but `key` is not" would only repeat that.
    pub fn ignore_consequences(&mut self, context: &str, key: &str) {
        self.consequences
            .push((context.to_string(), key.to_string()));
    }

    /// The 1-based line of byte `offset`.
    pub fn line_of(&self, offset: usize) -> usize {
        line_col(self.text, offset).0
    }

    fn located(&self, offset: usize, message: &str) -> String {
        let (line, column) = line_col(self.text, offset);
        format!("{}:{line}:{column}: {message}", self.origin)
    }

    /// The problems, located and in file order (the order found among
    /// problems at the same place).
    pub fn finish(mut self) -> Vec<String> {
        self.errors.sort_by_key(|(offset, _)| *offset);
        self.errors
            .iter()
            .map(|(offset, message)| self.located(*offset, message))
            .collect()
    }
}

/// Whether `message` is about `context` (`limits[2]` covers
/// `limits[2] "gpt-4o": …`, not `limits[20]`) and names `key` as a word.
fn names_key_in(message: &str, context: &str, key: &str) -> bool {
    let Some(rest) = message.strip_prefix(context) else {
        return false;
    };
    if context.is_empty() || !rest.starts_with([' ', ':']) {
        return false;
    }
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    rest.match_indices(key).any(|(at, _)| {
        let before = rest[..at].chars().next_back();
        let after = rest[at + key.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// `message` with every quoted string and every other word masked as a
/// Redis URL could be. toml's messages quote a value (`invalid type:
/// string "redis://:pw@host"`), so a quoted string is masked whole: a
/// password may hold a space (or an escaped quote).
fn mask_urls_in_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while !rest.is_empty() {
        let end = if let Some(quoted) = rest.strip_prefix('"') {
            let mut escaped = false;
            let close = quoted.char_indices().find_map(|(i, c)| {
                let closes = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                closes.then_some(i)
            });
            match close {
                Some(close) => {
                    out.push('"');
                    out.push_str(&mask_redis_url(&quoted[..close]));
                    out.push('"');
                    close + 2
                }
                // No closing quote: mask the rest as one string.
                None => {
                    out.push_str(&mask_redis_url(rest));
                    rest.len()
                }
            }
        } else if rest.starts_with(char::is_whitespace) {
            let word = rest
                .find(|c: char| !c.is_whitespace())
                .unwrap_or(rest.len());
            out.push_str(&rest[..word]);
            word
        } else {
            let word = rest
                .find(|c: char| c.is_whitespace() || c == '"')
                .unwrap_or(rest.len());
            out.push_str(&mask_redis_url(&rest[..word]));
            word
        };
        rest = &rest[end..];
    }
    out
}

/// The message of a file toml cannot read into the schema (bad syntax, an
/// unknown key, a value of the wrong type), located when toml says where.
pub(super) fn syntax_error(err: &toml::de::Error, text: &str, origin: &str) -> String {
    let message = readable_message(err);
    let message = match toml_key_path(err) {
        Some(keys) => format!("{keys}: {message}"),
        None => message,
    };
    match err.span() {
        Some(span) => {
            let (line, column) = line_col(text, span.start);
            format!("{origin}:{line}:{column}: {message}")
        }
        None => format!("{origin}: {message}"),
    }
}

/// toml's message for `err`, Redis URLs masked and Rust's type names
/// (`i64`, `f64`) said as a user would.
pub(super) fn readable_message(err: &toml::de::Error) -> String {
    mask_urls_in_message(err.message())
        .replace("expected i64", "expected an integer")
        .replace("expected f64", "expected a number")
}

/// The dotted key path toml attaches to a deserialization error (e.g.
/// `server.socket_mode`); toml only renders it when the error carries no
/// input, so render a copy without.
fn toml_key_path(err: &toml::de::Error) -> Option<String> {
    let mut bare = err.clone();
    bare.set_input(None);
    let rendered = bare.to_string();
    let rendered = rendered.trim_end();
    if rendered == err.message().trim_end() {
        return None;
    }
    let keys = rendered
        .lines()
        .last()?
        .strip_prefix("in `")?
        .strip_suffix('`')?;
    (!keys.is_empty()).then(|| keys.to_string())
}

/// An optional setting after its check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Checked<T> {
    /// Not in the file: the default applies.
    Absent,
    /// In the file and valid.
    Valid(T),
    /// In the file and reported as a problem.
    Invalid,
}

impl<T> Checked<T> {
    /// Checks `given` when it is there; `check` reports what is wrong.
    pub fn given<R>(given: Option<&R>, check: impl FnOnce(&R) -> Option<T>) -> Self {
        match given.map(check) {
            None => Checked::Absent,
            Some(Some(value)) => Checked::Valid(value),
            Some(None) => Checked::Invalid,
        }
    }

    /// The valid value; `None` when absent or invalid.
    pub fn value(self) -> Option<T> {
        match self {
            Checked::Valid(value) => Some(value),
            Checked::Absent | Checked::Invalid => None,
        }
    }

    /// The valid value, or `default` when absent; `None` when invalid.
    pub fn or_default(self, default: Option<T>) -> Option<T> {
        match self {
            Checked::Valid(value) => Some(value),
            Checked::Absent => default,
            Checked::Invalid => None,
        }
    }

    /// The setting for a resolved entry: `Some(None)` when absent,
    /// `Some(Some(value))` when valid, `None` when invalid (so that `?`
    /// drops the entry).
    pub fn resolved(self) -> Option<Option<T>> {
        match self {
            Checked::Absent => Some(None),
            Checked::Valid(value) => Some(Some(value)),
            Checked::Invalid => None,
        }
    }
}

/// An integer in `min..=max`, or an error at its place.
pub(super) fn check_int(
    d: &mut Diagnostics,
    context: &str,
    field: &str,
    value: &Spanned<i64>,
    min: i64,
    max: u64,
) -> Option<u64> {
    let v = *value.get_ref();
    let at = value.span().start;
    if min > 1 && v < min {
        d.error(
            at,
            format!("{context}: {field} must be at least {min} (got {v})"),
        );
        None
    } else if min == 1 && v < min {
        d.error(
            at,
            format!("{context}: {field} must be greater than zero (got {v})"),
        );
        None
    } else if v < min {
        d.error(
            at,
            format!("{context}: {field} must not be negative (got {v})"),
        );
        None
    } else if v as u64 > max {
        d.error(
            at,
            format!("{context}: {field} must be at most {max} (got {v})"),
        );
        None
    } else {
        Some(v as u64)
    }
}

/// An optional integer in `1..=max` (a rate, a burst, a request size).
pub(super) fn check_positive(
    d: &mut Diagnostics,
    context: &str,
    field: &str,
    value: &Option<Spanned<i64>>,
    max: u64,
) -> Checked<u64> {
    Checked::given(value.as_ref(), |v| check_int(d, context, field, v, 1, max))
}

/// The interval a fraction must lie in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fraction {
    /// `[0, 1]`.
    ZeroToOne,
    /// `[0, 1)`: never all of it.
    BelowOne,
    /// `(0, 1]`: never none of it.
    AboveZero,
}

/// A fraction in `interval`, or an error at its place.
pub(super) fn check_fraction(
    d: &mut Diagnostics,
    context: &str,
    field: &str,
    value: &Spanned<f64>,
    interval: Fraction,
) -> Option<f64> {
    let v = *value.get_ref();
    let (within, written) = match interval {
        Fraction::ZeroToOne => ((0.0..=1.0).contains(&v), "[0, 1]"),
        Fraction::BelowOne => ((0.0..1.0).contains(&v), "[0, 1)"),
        Fraction::AboveZero => (v > 0.0 && v <= 1.0, "(0, 1]"),
    };
    if within {
        Some(v)
    } else {
        d.error(
            value.span().start,
            format!("{context}: {field} must be in {written} (got {v})"),
        );
        None
    }
}

/// Reports `reference`, a name one entry gives to point at another, unless
/// it is one of `names` (the other section's `name` keys as written, valid
/// or not); `problem` says what is wrong with it.
pub(super) fn check_reference<'a>(
    d: &mut Diagnostics,
    reference: &Spanned<String>,
    names: impl Iterator<Item = Option<&'a Spanned<String>>>,
    problem: impl FnOnce(&str) -> String,
) {
    let name = reference.get_ref().as_str();
    let declared: Vec<&str> = names.flatten().map(|n| n.get_ref().as_str()).collect();
    if !declared.contains(&name) {
        let message = problem(name) + &did_you_mean(name, declared);
        d.error(reference.span().start, message);
    }
}

/// `; did you mean "gpt-4o"?` when one of `names` is close to `written`,
/// else nothing.
pub(super) fn did_you_mean<'a>(written: &str, names: impl IntoIterator<Item = &'a str>) -> String {
    match closest(written, names) {
        Some(name) => format!("; did you mean {name:?}?"),
        None => String::new(),
    }
}

/// `limits[1] "gpt-4o"` / `limits[1]` when the entry has no usable name.
fn entry_context(section: &str, index: usize, name: Option<&Spanned<String>>) -> String {
    match name {
        Some(name) if !name.get_ref().is_empty() => {
            format!("{section}[{index}] {:?}", name.get_ref())
        }
        _ => format!("{section}[{index}]"),
    }
}

/// Checks a limit, group or class name; `None` when unusable.
fn check_name(
    d: &mut Diagnostics,
    context: &str,
    name: Option<&Spanned<String>>,
    entry_at: usize,
) -> Option<String> {
    let Some(name) = name else {
        d.error(entry_at, format!("{context}: name is required"));
        return None;
    };
    let value = name.get_ref();
    let at = name.span().start;
    if value.is_empty() {
        d.error(at, format!("{context}: name must not be empty"));
        None
    } else if value.len() > MAX_NAME_LEN {
        d.error(
            at,
            format!(
                "{context}: name is {} bytes long, longer than the maximum of {MAX_NAME_LEN}",
                value.len()
            ),
        );
        None
    } else {
        Some(value.clone())
    }
}

/// The entries of one array of tables (`[[limits]]`, …) named so far, each
/// with where it was declared, so that a second entry of the same name is
/// reported against the first.
pub(super) struct DeclaredNames {
    /// The array's key, e.g. `limits`.
    section: &'static str,
    /// What an entry is called in messages, e.g. `limit`.
    kind: &'static str,
    names: Vec<(String, usize)>,
}

/// An entry whose name was checked.
pub(super) struct NamedEntry {
    /// Where messages about the entry say they are: `limits[1] "gpt-4o"`.
    pub context: String,
    /// The name, when usable (duplicates included).
    pub name: Option<String>,
}

impl DeclaredNames {
    /// No entries yet of the array `section`, each entry a `kind`.
    pub fn new(section: &'static str, kind: &'static str) -> Self {
        DeclaredNames {
            section,
            kind,
            names: Vec::new(),
        }
    }

    /// Checks the name of entry `index` (at `entry_at`) and records it, or
    /// reports it as a duplicate of an earlier entry.
    pub fn declare(
        &mut self,
        d: &mut Diagnostics,
        index: usize,
        name: Option<&Spanned<String>>,
        entry_at: usize,
    ) -> NamedEntry {
        let context = entry_context(self.section, index, name);
        let checked = check_name(d, &context, name, entry_at);
        if let (Some(checked), Some(spanned)) = (&checked, name) {
            let at = spanned.span().start;
            if let Some((_, first_at)) = self.names.iter().find(|(n, _)| n == checked) {
                let first_line = d.line_of(*first_at);
                d.error(
                    at,
                    format!(
                        "{context}: duplicate {} name {checked:?} (first declared at line {first_line})",
                        self.kind
                    ),
                );
            } else {
                self.names.push((checked.clone(), at));
            }
        }
        NamedEntry {
            context,
            name: checked,
        }
    }

    /// Whether an entry was declared as `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.names.iter().any(|(n, _)| n == name)
    }

    /// `declared: "a", "b"`, or `no [[limits]] are declared`.
    pub fn describe(&self) -> String {
        let header = format!("[[{}]]", self.section);
        declared_list(self.names.iter().map(|(n, _)| n.as_str()), &header)
    }

    /// `; did you mean "a"?` when a declared name is close to `written`.
    pub fn did_you_mean(&self, written: &str) -> String {
        did_you_mean(written, self.names.iter().map(|(n, _)| n.as_str()))
    }
}

/// `declared: "a", "b"`, or `no SECTION are declared`.
pub(super) fn declared_list<'a>(names: impl Iterator<Item = &'a str>, section: &str) -> String {
    let names: Vec<String> = names.map(|n| format!("{n:?}")).collect();
    if names.is_empty() {
        format!("no {section} are declared")
    } else {
        format!("declared: {}", names.join(", "))
    }
}
