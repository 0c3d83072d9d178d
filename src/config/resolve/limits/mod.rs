//! `[[limits]]`: each limit's name and group, its buckets ([`buckets`]),
//! and how its requests are counted and charged ([`counting`]).

mod buckets;
mod counting;

use toml::Spanned;

use crate::config::diagnostics::{DeclaredNames, Diagnostics, declared_list};
use crate::config::model::{GroupConfig, LimitConfig};
use crate::config::raw::{RawGroup, RawLimit, declares};

/// The limits that could be resolved, and the names declared.
pub(super) fn resolve_limits(
    raw: &[Spanned<RawLimit>],
    raw_groups: &[Spanned<RawGroup>],
    groups: &[GroupConfig],
    d: &mut Diagnostics,
) -> (Vec<LimitConfig>, DeclaredNames) {
    let mut names = DeclaredNames::new("limits", "limit");
    let mut limits = Vec::new();
    for (index, entry) in raw.iter().enumerate() {
        let limit = entry.get_ref();
        let entry_at = entry.span().start;
        let named = names.declare(d, index, limit.name.as_ref(), entry_at);
        if let Some(group) = &limit.group {
            check_group(group, raw_groups, groups, &named.context, d);
        }
        if let Some(resolved) = resolve_limit(limit, &named.context, entry_at, d) {
            limits.push(LimitConfig {
                name: named.name.unwrap_or_default(),
                ..resolved
            });
        }
    }
    (limits, names)
}

/// Reports a `group` no `[[groups]]` entry declares.
fn check_group(
    group: &Spanned<String>,
    raw_groups: &[Spanned<RawGroup>],
    groups: &[GroupConfig],
    context: &str,
    d: &mut Diagnostics,
) {
    let written = raw_groups.iter().map(|g| g.get_ref().name.as_ref());
    if !declares(written, group.get_ref()) {
        d.error(
            group.span().start,
            format!(
                "{context}: group {:?} is not a declared group ({})",
                group.get_ref(),
                declared_list(groups.iter().map(|g| g.name.as_str()), "[[groups]]")
            ),
        );
    }
}

/// The resolved limit (name left empty for the caller), or `None` when a
/// required value is missing or wrong.
fn resolve_limit(
    limit: &RawLimit,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<LimitConfig> {
    // Both steps run, so that one pass reports every problem.
    let buckets = buckets::resolve_buckets(limit, context, entry_at, d);
    let counting = counting::resolve_counting(limit, context, entry_at, d);
    let (buckets, counting) = (buckets?, counting?);
    Some(LimitConfig {
        name: String::new(),
        tokens_per_minute: buckets.combined.per_minute,
        requests_per_minute: buckets.requests_per_minute,
        burst_tokens: buckets.combined.burst,
        burst_requests: buckets.burst_requests,
        input_tokens_per_minute: buckets.input.map(|input| input.per_minute),
        output_tokens_per_minute: buckets.output.map(|output| output.per_minute),
        burst_input_tokens: buckets.input.map(|input| input.burst),
        burst_output_tokens: buckets.output.map(|output| output.burst),
        model: counting.model,
        tenant_share: buckets.tenant_share,
        max_request_tokens: buckets.max_request_tokens,
        group: limit.group.as_ref().map(|g| g.get_ref().clone()),
        provider: counting.provider,
        tokenizer: counting.tokenizer,
        chars_per_token: counting.chars_per_token,
        safety_factor: counting.safety_factor,
        default_max_output_tokens: counting.default_max_output_tokens,
        cost_rule: counting.cost_rule,
        settle: counting.settle,
        learn_max_output: counting.learn_max_output,
    })
}
