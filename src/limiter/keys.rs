//! The key schema: the one place that turns a bucket's identity into a
//! key, shared by the planner (which names every bucket of an acquire) and
//! the stores (Redis keys; the embedded store's map keys).
//!
//! ```text
//! PREFIX:{l:LIMIT}:LIMIT:ROLE             a limit's own bucket (no group)
//! PREFIX:{g:GROUP}:LIMIT:ROLE             a limit's own bucket in a group
//! PREFIX:{g:GROUP}:ROLE                   a group's bucket, shared by its limits
//! PREFIX:{TAG}:LIMIT:tenant:TENANT        a tenant's share of a limit
//! PREFIX:{TAG}:LIMIT:concurrent           a limit's concurrency slots
//! PREFIX:{TAG}:LIMIT:budget:SPAN[:PERIOD]  a limit's spend budget
//! PREFIX:{TAG}:LIMIT:tenant:TENANT:budget:SPAN[:PERIOD]
//!                                         a tenant's budget on a limit
//! PREFIX:{g:GROUP}:budget:SPAN[:PERIOD]   a group's budget
//! PREFIX:{g:GROUP}:tenant:TENANT:budget:SPAN[:PERIOD]
//!                                         a tenant's budget on a group
//! ```
//!
//! A calendar budget's key ends in its period's label (`2026-12-07`,
//! `2026-W50`, `2026-12`), a rolling budget's in its span; a calendar
//! budget's count of settled spend has its budget's key and `:spent`.
//!
//! Every key of one acquire carries the same Redis Cluster hash tag (`{…}`),
//! so one script call touches one slot. Names are escaped (`%`, `:`, `{`, `}`
//! as `%25`, `%3A`, `%7B`, `%7D`): an escaped name holds no separator and no
//! brace, so the tag is always the key's first `{…}`, and the number of
//! segments after it tells the kinds apart. Distinct buckets therefore never
//! share a key, whatever their names (a limit named `group`, a tenant named
//! `a:tenant:b`, a limit named like another's group).

use std::fmt::Write;

use crate::budget::spans::Span;
use crate::limiter::BucketRole;

/// What a bucket belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketOwner<'a> {
    /// One of a limit's own buckets; `group` is the limit's group, if any.
    Limit {
        limit: &'a str,
        group: Option<&'a str>,
    },
    /// A bucket of a group, shared by every limit in it.
    Group { group: &'a str },
    /// A tenant's share of a limit.
    Tenant {
        limit: &'a str,
        group: Option<&'a str>,
        tenant: &'a str,
    },
    /// A tenant's calls through every limit of a group (its budgets only).
    GroupTenant { group: &'a str, tenant: &'a str },
}

/// The key of `owner`'s bucket of `role` under `prefix` (which holds no
/// braces: config validation refuses them).
pub fn bucket_key(prefix: &str, owner: BucketOwner<'_>, role: BucketRole) -> String {
    owned_key(prefix, owner, role.key_segment())
}

/// The key of a limit's concurrency slots (`lua/slots.lua`), in the slot
/// of its buckets; no bucket role is named `concurrent`.
pub fn slots_key(prefix: &str, limit: &str, group: Option<&str>) -> String {
    owned_key(prefix, BucketOwner::Limit { limit, group }, SLOTS_SEGMENT)
}

/// The last segment of a limit's slots key.
const SLOTS_SEGMENT: &str = "concurrent";

/// `owner`'s key ending in `segment` (a tenant's ends in its name instead).
fn owned_key(prefix: &str, owner: BucketOwner<'_>, segment: &str) -> String {
    let mut key = owner_path(prefix, owner);
    match owner {
        BucketOwner::Tenant { .. } | BucketOwner::GroupTenant { .. } => {}
        BucketOwner::Limit { .. } | BucketOwner::Group { .. } => {
            key.push(':');
            key.push_str(segment);
        }
    }
    key
}

/// The key of a spend budget's bucket over `span`: `owner`'s path, then
/// `:budget:SPAN`, then for a calendar budget `:LABEL`, the period's (so
/// that each period is a bucket of its own, which starts full).
pub fn budget_key(prefix: &str, owner: BucketOwner<'_>, span: Span, label: Option<&str>) -> String {
    let mut key = owner_path(prefix, owner);
    key.push_str(":budget:");
    key.push_str(span.name());
    if let Some(label) = label {
        key.push(':');
        push_escaped(&mut key, label);
    }
    key
}

/// The key of a calendar budget's count of settled spend: its bucket's key
/// and `:spent` (no budget key ends so: a period's label never does).
pub fn spent_key(budget_key: &str) -> String {
    format!("{budget_key}:spent")
}

/// The prefix, the owner's hash tag, its limit and its tenant, if any.
fn owner_path(prefix: &str, owner: BucketOwner<'_>) -> String {
    let mut key = String::with_capacity(prefix.len() + 64);
    key.push_str(prefix);
    let (limit, group) = match owner {
        BucketOwner::Limit { limit, group } | BucketOwner::Tenant { limit, group, .. } => {
            (Some(limit), group)
        }
        BucketOwner::Group { group } | BucketOwner::GroupTenant { group, .. } => {
            (None, Some(group))
        }
    };
    match (group, limit) {
        (Some(group), _) => push_tag(&mut key, 'g', group),
        (None, Some(limit)) => push_tag(&mut key, 'l', limit),
        (None, None) => unreachable!("a group bucket always names its group"),
    }
    if let Some(limit) = limit {
        key.push(':');
        push_escaped(&mut key, limit);
    }
    if let BucketOwner::Tenant { tenant, .. } | BucketOwner::GroupTenant { tenant, .. } = owner {
        key.push_str(":tenant:");
        push_escaped(&mut key, tenant);
    }
    key
}

/// The part of a key that decides its Redis Cluster slot, `{…}` included:
/// the first braces, or the whole key when it has none.
pub fn slot_of(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let close = open + key[open..].find('}')?;
            Some(&key[open..=close])
        })
        .unwrap_or(key)
}

/// The record of one script call (`lua/batch.lua`), in the slot of
/// `bucket_key` and under its prefix: `PREFIX:{TAG}:call:ID`. No bucket key
/// has this shape: a limit's bucket ends in a bucket name, never in an id.
pub fn call_record_key(bucket_key: &str, id: u64) -> String {
    let through_tag = match bucket_key
        .find('{')
        .and_then(|open| bucket_key[open..].find('}').map(|close| open + close + 1))
    {
        Some(end) => &bucket_key[..end],
        None => bucket_key,
    };
    format!("{through_tag}:call:{id:016x}")
}

fn push_tag(key: &mut String, kind: char, name: &str) {
    key.push_str(":{");
    key.push(kind);
    key.push(':');
    push_escaped(key, name);
    key.push('}');
}

/// Appends `name` with the schema's separators and braces percent-escaped.
fn push_escaped(key: &mut String, name: &str) {
    for c in name.chars() {
        match c {
            '%' | ':' | '{' | '}' => {
                let _ = write!(key, "%{:02X}", c as u32);
            }
            c => key.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::limiter::BudgetOwner;

    #[test]
    fn plain_names_read_as_before() {
        let cases = [
            (
                BucketOwner::Limit {
                    limit: "gpt",
                    group: None,
                },
                BucketRole::Tokens,
                "rk:{l:gpt}:gpt:tokens",
            ),
            (
                BucketOwner::Limit {
                    limit: "mini",
                    group: Some("org"),
                },
                BucketRole::Requests,
                "rk:{g:org}:mini:requests",
            ),
            (
                BucketOwner::Group { group: "org" },
                BucketRole::GroupTokens,
                "rk:{g:org}:tokens",
            ),
            (
                BucketOwner::Tenant {
                    limit: "gpt",
                    group: None,
                    tenant: "acme",
                },
                BucketRole::Tenant,
                "rk:{l:gpt}:gpt:tenant:acme",
            ),
            (
                BucketOwner::Limit {
                    limit: "a:b{c}%",
                    group: None,
                },
                BucketRole::InputTokens,
                "rk:{l:a%3Ab%7Bc%7D%25}:a%3Ab%7Bc%7D%25:input_tokens",
            ),
        ];
        for (owner, role, expected) in cases {
            assert_eq!(
                bucket_key("rk", owner, role),
                expected,
                "{owner:?} {role:?}"
            );
        }
    }

    /// Every bucket that adversarial names can describe gets its own key,
    /// and every key of a grouped limit shares the group's hash tag.
    #[test]
    fn distinct_buckets_never_share_a_key() {
        let names = [
            "group",
            "tenant",
            "tokens",
            "requests",
            "org",
            "l",
            "g",
            "a",
            "a:b",
            "b",
            ":",
            "::",
            "{",
            "}",
            "{g:org}",
            "org}:x",
            "%",
            "%3A",
            "%25",
            "a%3Ab",
            "tenant:a",
            "a:tenant:b",
            "gpt:tokens",
            "",
            " ",
        ];
        let limit_roles = [
            BucketRole::Tokens,
            BucketRole::InputTokens,
            BucketRole::OutputTokens,
            BucketRole::Requests,
        ];
        let group_roles = [BucketRole::GroupTokens, BucketRole::GroupRequests];
        let groups: Vec<Option<&str>> = std::iter::once(None)
            .chain(names.iter().copied().map(Some))
            .collect();
        let mut buckets: Vec<(BucketOwner, BucketRole)> = Vec::new();
        for &group in &groups {
            if let Some(group) = group {
                for role in group_roles {
                    buckets.push((BucketOwner::Group { group }, role));
                }
            }
            for limit in names {
                for role in limit_roles {
                    buckets.push((BucketOwner::Limit { limit, group }, role));
                }
                for tenant in names {
                    buckets.push((
                        BucketOwner::Tenant {
                            limit,
                            group,
                            tenant,
                        },
                        BucketRole::Tenant,
                    ));
                }
            }
        }
        let mut seen: HashMap<String, (BucketOwner, BucketRole)> = HashMap::new();
        for &group in &groups {
            for limit in names {
                let key = slots_key("ratekeeper", limit, group);
                let owner = BucketOwner::Limit { limit, group };
                assert!(BucketRole::all().all(|r| r.key_segment() != SLOTS_SEGMENT));
                // Recorded under the role of no bucket it could be confused with.
                if let Some(earlier) = seen.insert(key.clone(), (owner, BucketRole::Tenant)) {
                    panic!("{key} names both {earlier:?} and {limit}'s slots");
                }
            }
        }
        // Budgets, over fewer names (there are many more of them).
        let few = &names[..12];
        let few_groups = &groups[..8];
        let labels = [None, Some("2026-12-07"), Some("2026-W50"), Some("2026-12")];
        let mut budgets: Vec<(BucketOwner, Span, Option<&str>)> = Vec::new();
        for &group in few_groups {
            let mut owners = Vec::new();
            if let Some(group) = group {
                owners.push(BucketOwner::Group { group });
                for &tenant in few {
                    owners.push(BucketOwner::GroupTenant { group, tenant });
                }
            }
            for &limit in few {
                owners.push(BucketOwner::Limit { limit, group });
                for &tenant in few {
                    owners.push(BucketOwner::Tenant {
                        limit,
                        group,
                        tenant,
                    });
                }
            }
            for owner in owners {
                for span in Span::ALL {
                    for label in labels {
                        budgets.push((owner, span, label));
                    }
                }
            }
        }
        let keyed = buckets
            .into_iter()
            .map(|(owner, role)| (bucket_key("ratekeeper", owner, role), owner, role))
            .chain(budgets.into_iter().flat_map(|(owner, span, label)| {
                let key = budget_key("ratekeeper", owner, span, label);
                let role = BucketRole::Budget(BudgetOwner::Limit, span);
                let counter = label.map(|_| (spent_key(&key), owner, role));
                std::iter::once((key, owner, role)).chain(counter)
            }));
        for (key, owner, role) in keyed {
            if let Some(earlier) = seen.insert(key.clone(), (owner, role)) {
                panic!("{key} names both {earlier:?} and {:?}", (owner, role));
            }
            let group = match owner {
                BucketOwner::Limit { group, .. } | BucketOwner::Tenant { group, .. } => group,
                BucketOwner::Group { group } | BucketOwner::GroupTenant { group, .. } => {
                    Some(group)
                }
            };
            if let Some(group) = group {
                let tag = hash_tag(&key);
                let group_key =
                    bucket_key("x", BucketOwner::Group { group }, BucketRole::GroupTokens);
                assert_eq!(tag, hash_tag(&group_key));
                assert!(tag.starts_with("g:"), "{key}");
            }
        }
        assert!(seen.len() > 66_000, "{} buckets", seen.len());
    }

    /// The part of `key` Redis Cluster hashes: between the first `{` and
    /// the next `}`.
    fn hash_tag(key: &str) -> &str {
        slot_of(key).trim_start_matches('{').trim_end_matches('}')
    }

    #[test]
    fn call_records_live_in_their_batch_slot_and_look_like_no_bucket() {
        let bucket = bucket_key(
            "rk",
            BucketOwner::Limit {
                limit: "call",
                group: Some("g"),
            },
            BucketRole::Tokens,
        );
        let record = call_record_key(&bucket, 0x1f);
        assert_eq!(record, "rk:{g:g}:call:000000000000001f");
        assert_eq!(slot_of(&record), slot_of(&bucket));
        assert_eq!(
            call_record_key("untagged", 1),
            "untagged:call:0000000000000001"
        );
        assert_eq!(slot_of("untagged"), "untagged");
    }
}
