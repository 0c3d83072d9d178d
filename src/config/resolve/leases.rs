//! `[leases]`: what becomes of leases nobody reports.

use crate::config::diagnostics::{Diagnostics, Fraction, check_fraction, check_int};
use crate::config::model::{LeaseConfig, MAX_WAIT_MS};
use crate::config::raw::RawLeases;

/// Longest `expire_after_ms`: a week.
const MAX_EXPIRE_AFTER_MS: u64 = 7 * 24 * 3_600_000;
/// Largest `max_open`.
const MAX_OPEN_LEASES: u64 = 100_000_000;

/// The `[leases]` section; bad values are reported and left at their defaults.
pub(super) fn resolve_leases(raw: &RawLeases, d: &mut Diagnostics) -> LeaseConfig {
    let context = "leases";
    let mut resolved = LeaseConfig::default();
    if let Some(rule) = &raw.on_disconnect {
        resolved.on_disconnect = *rule.get_ref();
    }
    if let Some(fraction) = &raw.disconnect_refund_fraction {
        let field = "disconnect_refund_fraction";
        if let Some(v) = check_fraction(d, context, field, fraction, Fraction::ZeroToOne) {
            resolved.disconnect_refund_fraction = v;
        }
    }
    if let Some(grace) = &raw.disconnect_grace_ms {
        if let Some(v) = check_int(d, context, "disconnect_grace_ms", grace, 0, MAX_WAIT_MS) {
            resolved.disconnect_grace_ms = v;
        }
    }
    if let Some(expire) = &raw.expire_after_ms {
        if let Some(v) = check_int(
            d,
            context,
            "expire_after_ms",
            expire,
            1,
            MAX_EXPIRE_AFTER_MS,
        ) {
            resolved.expire_after_ms = v;
        }
    }
    if let Some(max_open) = &raw.max_open {
        if let Some(v) = check_int(d, context, "max_open", max_open, 1, MAX_OPEN_LEASES) {
            resolved.max_open = v;
        }
    }
    resolved
}
