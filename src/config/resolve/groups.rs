//! `[[groups]]`: buckets shared by several limits.

use toml::Spanned;

use crate::config::diagnostics::{DeclaredNames, Diagnostics, check_positive};
use crate::config::model::{GroupConfig, MAX_BURST, MAX_RATE_PER_MINUTE};
use crate::config::raw::RawGroup;

use super::budgets::resolve_budgets;

/// The `[[groups]]`, each checked; duplicates and bad values reported.
pub(super) fn resolve_groups(raw: &[Spanned<RawGroup>], d: &mut Diagnostics) -> Vec<GroupConfig> {
    let mut names = DeclaredNames::new("groups", "group");
    let mut groups = Vec::new();
    for (index, entry) in raw.iter().enumerate() {
        let group = entry.get_ref();
        let named = names.declare(d, index, group.name.as_ref(), entry.span().start);
        if let Some(resolved) = resolve_group(group, &named.context, entry.span().start, d) {
            groups.push(GroupConfig {
                name: named.name.unwrap_or_default(),
                ..resolved
            });
        }
    }
    groups
}

/// One group (name left empty for the caller), or `None` when a value is wrong.
fn resolve_group(
    group: &RawGroup,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<GroupConfig> {
    let tpm = check_positive(
        d,
        context,
        "tokens_per_minute",
        &group.tokens_per_minute,
        MAX_RATE_PER_MINUTE,
    );
    let rpm = check_positive(
        d,
        context,
        "requests_per_minute",
        &group.requests_per_minute,
        MAX_RATE_PER_MINUTE,
    );
    let burst_tokens = check_positive(d, context, "burst_tokens", &group.burst_tokens, MAX_BURST);
    let burst_requests = check_positive(
        d,
        context,
        "burst_requests",
        &group.burst_requests,
        MAX_BURST,
    );
    let budgets = resolve_budgets(
        &group.budget,
        &group.tenant_budget,
        &group.tenant_budgets,
        context,
        d,
    );
    let budgeted =
        group.budget.is_some() || group.tenant_budget.is_some() || group.tenant_budgets.is_some();
    if group.tokens_per_minute.is_none() && group.requests_per_minute.is_none() && !budgeted {
        d.error(
            entry_at,
            format!("{context}: a group needs tokens_per_minute, requests_per_minute or a budget"),
        );
    }
    for (burst, rate_field, rate_value) in [
        (
            &group.burst_tokens,
            "tokens_per_minute",
            &group.tokens_per_minute,
        ),
        (
            &group.burst_requests,
            "requests_per_minute",
            &group.requests_per_minute,
        ),
    ] {
        if let (Some(burst), None) = (burst, rate_value) {
            d.error(
                burst.span().start,
                format!(
                    "{context}: a burst is set but {rate_field} is not (a bucket needs a rate)"
                ),
            );
        }
    }
    let (tpm, rpm) = (tpm.resolved()?, rpm.resolved()?);
    let (burst_tokens, burst_requests) = (burst_tokens.resolved()?, burst_requests.resolved()?);
    let budgets = budgets?;
    Some(GroupConfig {
        name: String::new(),
        tokens_per_minute: tpm,
        requests_per_minute: rpm,
        burst_tokens: burst_tokens.or(tpm),
        burst_requests: burst_requests.or(rpm),
        budgets,
    })
}
