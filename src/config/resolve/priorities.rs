//! `[[priorities]]` and `default_priority`: the priority classes, each
//! checked against the limits it names.

use toml::Spanned;

use crate::config::diagnostics::{
    DeclaredNames, Diagnostics, Fraction, check_fraction, check_int, check_reference,
};
use crate::config::model::{MAX_WAIT_MS, PriorityClass};
use crate::config::raw::{RawLimit, RawPriority};

/// The declared classes (those that could be resolved) and their names.
pub(super) fn resolve_priorities(
    raw: &[Spanned<RawPriority>],
    raw_limits: &[Spanned<RawLimit>],
    limit_names: &DeclaredNames,
    d: &mut Diagnostics,
) -> (Vec<PriorityClass>, DeclaredNames) {
    let mut names = DeclaredNames::new("priorities", "priority class");
    let mut classes = Vec::new();
    for (index, entry) in raw.iter().enumerate() {
        let class = entry.get_ref();
        let named = names.declare(d, index, class.name.as_ref(), entry.span().start);
        let context = named.context.as_str();
        let mut resolved = PriorityClass {
            name: named.name.clone().unwrap_or_default(),
            ..PriorityClass::implicit_default()
        };
        if let Some(fraction) = &class.reserved_fraction {
            let field = "reserved_fraction";
            if let Some(v) = check_fraction(d, context, field, fraction, Fraction::BelowOne) {
                resolved.reserved_fraction = v;
            }
        }
        if let Some(wait) = &class.max_wait_ms {
            if let Some(v) = check_int(d, context, "max_wait_ms", wait, 0, MAX_WAIT_MS) {
                resolved.max_wait_ms = v;
            }
        }
        if let Some(list) = &class.limits {
            check_class_limits(list, raw_limits, limit_names, context, d);
            resolved.limits = Some(list.get_ref().iter().map(|l| l.get_ref().clone()).collect());
        }
        classes.push(resolved);
    }
    (classes, names)
}

/// Reports a class's `limits` that is empty or names an undeclared limit.
fn check_class_limits(
    list: &Spanned<Vec<Spanned<String>>>,
    raw_limits: &[Spanned<RawLimit>],
    limit_names: &DeclaredNames,
    context: &str,
    d: &mut Diagnostics,
) {
    if list.get_ref().is_empty() {
        d.error(
            list.span().start,
            format!(
                "{context}: limits is empty, so the class applies to no limit (omit it to apply the class to all limits)"
            ),
        );
    }
    for limit in list.get_ref() {
        let written = raw_limits.iter().map(|l| l.get_ref().name.as_ref());
        check_reference(d, limit, written, |name| {
            format!(
                "{context}: limits names {name:?}, which is not a declared limit ({})",
                limit_names.describe()
            )
        });
    }
}

/// Whether `default_priority` names a class: one of `declared`, or with no
/// `[[priorities]]` (`None`) the implicit one. Reports it when not.
pub(super) fn check_default_priority(
    default: &Spanned<String>,
    declared: Option<&DeclaredNames>,
    d: &mut Diagnostics,
) -> bool {
    let name = default.get_ref();
    let problem = match declared {
        None if name == PriorityClass::DEFAULT_NAME => return true,
        Some(classes) if classes.contains(name) => return true,
        None => format!(
            "no [[priorities]] are declared; the only class is the implicit {:?}",
            PriorityClass::DEFAULT_NAME
        ),
        Some(classes) => classes.describe(),
    };
    let suggestion = declared.map_or_else(String::new, |classes| classes.did_you_mean(name));
    d.error(
        default.span().start,
        format!(
            "default_priority {name:?} is not a declared priority class ({problem}){suggestion}"
        ),
    );
    false
}
