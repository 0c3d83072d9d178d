//! The parsed file read into its schema ([`RawFile`]), every unreadable key
//! reported rather than the first.
//!
//! serde stops at the first key it cannot read: an unknown key, a value of
//! the wrong type, a value that names no choice. So each such key is
//! reported at its place, with the key or value most likely meant, dropped
//! from the parsed document, and the rest read again, until it reads.
//! Validation (`super::resolve`) then reports its own problems with the
//! rest, except those that only follow from a dropped key.

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue, Deserializer};

use super::diagnostics::{Diagnostics, readable_message};
use super::raw::RawFile;
use super::suggest::closest;

/// Most keys dropped before the rest is left unread: far more than a file
/// has by mistake, few enough that rereading stays instant.
const MAX_DROPPED: usize = 100;

/// A key dropped from the document.
struct Dropped {
    /// The table it was in, as messages name it: `""` (top level),
    /// `server`, `limits[2]`.
    context: String,
    /// The key as written.
    key: String,
    /// The other keys of its table.
    siblings: Vec<String>,
}

/// The file `root` holds as its schema reads it. Every key that cannot be
/// read is reported to `d` and left out; `None` when the rest cannot be
/// read either (the problems are then in `d`).
pub(super) fn read(mut root: Spanned<DeTable<'_>>, d: &mut Diagnostics) -> Option<RawFile> {
    for _ in 0..=MAX_DROPPED {
        let err = match RawFile::deserialize(Deserializer::from(root.clone())) {
            Ok(raw) => return Some(raw),
            Err(err) => err,
        };
        let message = readable_message(&err);
        let Some(span) = err.span() else {
            d.unreadable(0, message);
            return None;
        };
        let Some(dropped) = drop_key_at(root.get_mut(), &span, "") else {
            d.unreadable(span.start, message);
            return None;
        };
        let (message, ignore) = explain(&dropped, &message);
        d.unreadable(span.start, message);
        if let Some(key) = ignore {
            if !dropped.context.is_empty() {
                d.ignore_consequences(&dropped.context, &key);
            }
        }
    }
    d.unreadable(
        usize::MAX,
        format!(
            "more than {MAX_DROPPED} keys cannot be read; the rest of the file was not checked"
        ),
    );
    None
}

/// The located message for a dropped key, and the key whose absence
/// follows from it (the dropped key, or the known key a misspelling meant).
fn explain(dropped: &Dropped, message: &str) -> (String, Option<String>) {
    let Dropped { context, key, .. } = dropped;
    if let Some((written, expected)) = written_and_expected(message, "unknown field `") {
        let meant = closest(written, backticked(expected));
        let message = match meant {
            Some(meant) => format!("unknown key `{written}`, did you mean `{meant}`?"),
            None => format!("unknown key `{written}`{expected}"),
        };
        let message = if context.is_empty() {
            message
        } else {
            format!("{context}: {message}")
        };
        // A misspelling of a key the table lacks: "X is required" follows.
        let ignore = meant
            .filter(|meant| !dropped.siblings.iter().any(|s| s == meant))
            .map(str::to_string);
        return (message, ignore);
    }
    let message = match written_and_expected(message, "unknown variant `") {
        Some((written, expected)) => {
            let meant = closest(written, backticked(expected))
                .map_or_else(String::new, |meant| format!("; did you mean `{meant}`?"));
            format!("unknown value `{written}`{expected}{meant}")
        }
        None => message.to_string(),
    };
    let path = if context.is_empty() {
        key.clone()
    } else {
        format!("{context}.{key}")
    };
    (format!("{path}: {message}"), Some(key.clone()))
}

/// A serde message such as ``unknown field `tokns`, expected one of `a`,
/// `b` `` split, after `prefix`, into the name written (`tokns`) and the
/// rest (``, expected one of `a`, `b` ``).
fn written_and_expected<'m>(message: &'m str, prefix: &str) -> Option<(&'m str, &'m str)> {
    message.strip_prefix(prefix)?.split_once('`')
}

/// The names serde lists in backticks: `` `a`, `b` or `c` ``.
fn backticked(expected: &str) -> impl Iterator<Item = &str> {
    expected.split('`').skip(1).step_by(2)
}

/// Drops the key of `table` (searched depth first, through tables and
/// arrays of tables) whose key or value holds `span`; `context` names
/// `table` in messages.
fn drop_key_at(
    table: &mut DeTable<'_>,
    span: &std::ops::Range<usize>,
    context: &str,
) -> Option<Dropped> {
    for (key, value) in table.iter_mut() {
        let inner = if context.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{context}.{}", key.get_ref())
        };
        let found = match value.get_mut() {
            DeValue::Table(child) => drop_key_at(child, span, &inner),
            DeValue::Array(items) => items.iter_mut().enumerate().find_map(|(i, item)| {
                let DeValue::Table(child) = item.get_mut() else {
                    return None;
                };
                drop_key_at(child, span, &format!("{inner}[{i}]"))
            }),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    let holds = |outer: std::ops::Range<usize>| outer.start <= span.start && span.end <= outer.end;
    let key = table
        .iter()
        .find(|(key, value)| holds(key.span()) || holds(value.span()))
        .map(|(key, _)| key.get_ref().to_string())?;
    table.remove(key.as_str());
    Some(Dropped {
        context: context.to_string(),
        siblings: table.keys().map(|k| k.get_ref().to_string()).collect(),
        key,
    })
}
