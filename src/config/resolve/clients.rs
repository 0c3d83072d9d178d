//! `[[clients]]`: which tenants and priority classes the peers of a uid
//! may name, each entry checked against the declared classes.

use toml::Spanned;

use crate::config::diagnostics::{Checked, DeclaredNames, Diagnostics, check_int, did_you_mean};
use crate::config::model::{ClientPolicy, PriorityClass};
use crate::config::raw::RawClient;
use crate::proto::MAX_NAME_LEN;

/// The entries that could be resolved. `classes` are the declared
/// priority classes, `None` when the file declares none (the only class is
/// then the implicit one).
pub(super) fn resolve_clients(
    raw: &[Spanned<RawClient>],
    classes: Option<&DeclaredNames>,
    d: &mut Diagnostics,
) -> Vec<ClientPolicy> {
    // Each uid listed so far, with the entry that lists it.
    let mut listed: Vec<(u32, usize)> = Vec::new();
    let mut others_at: Option<usize> = None;
    let mut policies = Vec::new();
    for (index, entry) in raw.iter().enumerate() {
        let client = entry.get_ref();
        let context = format!("clients[{index}]");
        let others = client.other_uids.as_ref().is_some_and(|o| *o.get_ref());
        let mut valid = true;
        let mut uids = Vec::new();
        match (&client.uids, others) {
            (Some(list), true) => {
                valid = false;
                d.error(
                    list.span().start,
                    format!(
                        "{context}: uids and other_uids = true exclude each other \
                         (other_uids is the entry of every uid no entry lists)"
                    ),
                );
            }
            (Some(list), false) if list.get_ref().is_empty() => {
                valid = false;
                d.error(
                    list.span().start,
                    format!("{context}: uids is empty, so the entry applies to nobody"),
                );
            }
            (Some(list), false) => {
                for (i, uid) in list.get_ref().iter().enumerate() {
                    let label = format!("uids[{i}]");
                    let max = u64::from(u32::MAX);
                    let Some(uid_value) = check_int(d, &context, &label, uid, 0, max) else {
                        valid = false;
                        continue;
                    };
                    let uid_value = uid_value as u32;
                    match listed.iter().find(|(listed, _)| *listed == uid_value) {
                        Some((_, first)) => {
                            valid = false;
                            d.error(
                                uid.span().start,
                                format!(
                                    "{context}: uid {uid_value} is already listed by clients[{first}]"
                                ),
                            );
                        }
                        None => {
                            listed.push((uid_value, index));
                            uids.push(uid_value);
                        }
                    }
                }
            }
            (None, true) => match others_at {
                Some(first) => {
                    valid = false;
                    d.error(
                        entry.span().start,
                        format!(
                            "{context}: other_uids = true is already set by clients[{first}]; \
                             only one entry can apply to every uid no entry lists"
                        ),
                    );
                }
                None => others_at = Some(index),
            },
            (None, false) => {
                valid = false;
                d.error(
                    entry.span().start,
                    format!(
                        "{context}: uids is required (or other_uids = true, for every uid no \
                         entry lists)"
                    ),
                );
            }
        }
        let tenants = Checked::given(client.tenants.as_ref(), |list| {
            check_tenants(list, &context, d)
        });
        let priorities = Checked::given(client.priorities.as_ref(), |list| {
            check_priorities(list, classes, &context, d)
        });
        let (Some(tenants), Some(priorities)) = (tenants.resolved(), priorities.resolved()) else {
            continue;
        };
        if valid {
            policies.push(ClientPolicy {
                uids,
                other_uids: others,
                tenants,
                priorities,
            });
        }
    }
    policies
}

/// An entry's `tenants`, or `None` when one is unusable (reported).
fn check_tenants(
    list: &Spanned<Vec<Spanned<String>>>,
    context: &str,
    d: &mut Diagnostics,
) -> Option<Vec<String>> {
    if list.get_ref().is_empty() {
        d.error(
            list.span().start,
            format!(
                "{context}: tenants is empty, so its uids could acquire nothing (an acquire \
                 must name one of the tenants listed; omit tenants to allow any)"
            ),
        );
        return None;
    }
    let mut valid = true;
    for tenant in list.get_ref() {
        let name = tenant.get_ref();
        let problem = if name.is_empty() {
            Some("a tenant name must not be empty".to_string())
        } else if name.len() > MAX_NAME_LEN {
            Some(format!(
                "tenant name of {} bytes is longer than the maximum of {MAX_NAME_LEN}",
                name.len()
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            valid = false;
            d.error(tenant.span().start, format!("{context}: {problem}"));
        }
    }
    valid.then(|| list.get_ref().iter().map(|t| t.get_ref().clone()).collect())
}

/// An entry's `priorities`, each a declared class; `None` when one is not
/// (reported, with the class it most likely misspells).
fn check_priorities(
    list: &Spanned<Vec<Spanned<String>>>,
    classes: Option<&DeclaredNames>,
    context: &str,
    d: &mut Diagnostics,
) -> Option<Vec<String>> {
    if list.get_ref().is_empty() {
        d.error(
            list.span().start,
            format!(
                "{context}: priorities is empty, so its uids could use no class (omit it to \
                 allow every class)"
            ),
        );
        return None;
    }
    let mut valid = true;
    for class in list.get_ref() {
        let name = class.get_ref();
        let (known, declared, suggestion) = match classes {
            Some(classes) => (
                classes.contains(name),
                classes.describe(),
                classes.did_you_mean(name),
            ),
            None => (
                name == PriorityClass::DEFAULT_NAME,
                format!(
                    "no [[priorities]] are declared; the only class is the implicit {:?}",
                    PriorityClass::DEFAULT_NAME
                ),
                did_you_mean(name, [PriorityClass::DEFAULT_NAME]),
            ),
        };
        if !known {
            valid = false;
            d.error(
                class.span().start,
                format!(
                    "{context}: priorities names {name:?}, which is not a declared priority \
                     class ({declared}){suggestion}"
                ),
            );
        }
    }
    valid.then(|| list.get_ref().iter().map(|c| c.get_ref().clone()).collect())
}
