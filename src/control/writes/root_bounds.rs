//! What a tenant-scoped admin token may not loosen. Its tenant (the
//! token's root) was bounded by whoever made the token: the token may
//! lower or add the root's limits and change its other fields, but never
//! raise or remove a limit of the root, nor change what decides how much
//! the root may spend or how it is treated (failure policy, shadow mode,
//! end-user limits, output reservation, queue class and weight). Below
//! the root it may set nothing looser than the root: a descendant's
//! failure policy, shadow mode and output reservation route its traffic
//! around what binds the root (the failure policy and shadow mode follow
//! a request's own tenant). Checked by the handler against its gateway's
//! snapshot and again under the write's lock ([`super::finish`]), so a
//! change computed from a stale snapshot cannot write an old, higher
//! limit back.

use crate::config::output_reservation::MaxExposure;
use crate::config::raw::RawTenant;
use crate::config::{Limits, OnStoreError, Policy, TenantPolicy};
use crate::control::runtime::Snapshot;

/// A refused change: the field's path in the body and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loosened {
    /// The field's path in the body (`limits.tpm`, `on_store_error`, …).
    pub param: String,
    /// Why, naming the field and the root.
    pub message: String,
}

/// The state a change is judged on: the control database and the policy
/// it composes to with the config file.
pub type State<'a> = (&'a Snapshot, &'a Policy);

/// Whether the change that turns `before` into `after` loosens what binds
/// `root` (the token's tenant), by its change to tenant `name` (`root`
/// itself or a descendant, created or updated). `None`: allowed.
pub fn loosened(root: &str, name: &str, before: State<'_>, after: State<'_>) -> Option<Loosened> {
    let (Some(root_after), Some(t_after)) = (tenant(after.1, root), tenant(after.1, name)) else {
        // Nothing to compare: the merge refuses the change elsewhere.
        return None;
    };
    if name == root {
        let root_before = tenant(before.1, root)?;
        return root_change(
            root,
            (root_before, spec(before.0, root)),
            (root_after, spec(after.0, root)),
        );
    }
    descendant_change(root_after, tenant(before.1, name), t_after)
}

fn tenant<'p>(p: &'p Policy, name: &str) -> Option<&'p TenantPolicy> {
    p.tenants.iter().find(|t| t.name == name)
}

/// The stored form of runtime tenant `name` (`None`: a tenant of the
/// config file, which no write changes).
fn spec<'s>(s: &'s Snapshot, name: &str) -> Option<&'s RawTenant> {
    s.tenants
        .iter()
        .find(|t| t.spec.name == name)
        .map(|t| &t.spec)
}

fn refuse(param: String, why: String) -> Option<Loosened> {
    let message = format!("{param}: {why}");
    Some(Loosened { param, message })
}

/// The root's own change: limits only lowered or added; the settings that
/// decide its spending unchanged.
fn root_change(
    root: &str,
    (b, b_spec): (&TenantPolicy, Option<&RawTenant>),
    (a, a_spec): (&TenantPolicy, Option<&RawTenant>),
) -> Option<Loosened> {
    let own = |param: String| {
        refuse(
            param,
            format!(
                "this admin token is limited to tenant {root:?} and cannot raise or remove a limit of {root:?} itself (it may lower or add one, and change its descendants)"
            ),
        )
    };
    if let Some(field) = raised(&b.limits, &a.limits) {
        return own(format!("limits.{field}"));
    }
    for (model, bl) in &b.model_limits {
        let al = a.model_limits.get(model).cloned().unwrap_or_default();
        if let Some(field) = raised(bl, &al) {
            return own(format!("model_limits.{model}.{field}"));
        }
    }
    let fixed = |param: &str| {
        refuse(
            param.to_string(),
            format!(
                "this admin token is limited to tenant {root:?} and cannot change this setting of {root:?} itself (only of its descendants)"
            ),
        )
    };
    if b.on_store_error != a.on_store_error {
        return fixed("on_store_error");
    }
    if b.shadow != a.shadow {
        return fixed("shadow");
    }
    if b.end_user_limits != a.end_user_limits {
        return fixed("end_user_limits");
    }
    if b.end_user_required != a.end_user_required {
        return fixed("end_user_required");
    }
    // The stored fields, not only what they resolve to: the root's own
    // value pinned to what it inherits today would stop a later change of
    // its ancestors from reaching it.
    let (Some(bs), Some(as_)) = (b_spec, a_spec) else {
        return None;
    };
    if bs.output_reservation != as_.output_reservation {
        return fixed("output_reservation");
    }
    if bs.max_exposure != as_.max_exposure {
        return fixed("max_exposure");
    }
    if bs.expected_quantile != as_.expected_quantile {
        return fixed("expected_quantile");
    }
    if bs.priority != as_.priority {
        return fixed("priority");
    }
    if bs.weight != as_.weight {
        return fixed("weight");
    }
    None
}

/// The first limit of `before` that `after` raises or removes (a burst
/// counted as its effective size: unset, the rate's), or whose
/// `cache_read_weight` it lowers.
fn raised(before: &Limits, after: &Limits) -> Option<&'static str> {
    let pairs = |l: &Limits| {
        [
            ("rpm", l.rpm),
            ("rpm_burst", l.rpm_burst.or(l.rpm)),
            ("tpm", l.tpm),
            ("tpm_burst", l.tpm_burst.or(l.tpm)),
            ("input_tpm", l.input_tpm),
            ("input_tpm_burst", l.input_tpm_burst.or(l.input_tpm)),
            ("output_tpm", l.output_tpm),
            ("output_tpm_burst", l.output_tpm_burst.or(l.output_tpm)),
            ("max_concurrent", l.max_concurrent),
            ("tokens_per_day", l.tokens_per_day),
            ("tokens_per_month", l.tokens_per_month),
            ("requests_per_day", l.requests_per_day),
            ("usd_per_day", l.usd_per_day),
            ("usd_per_month", l.usd_per_month),
            ("tokens_per_5h", l.tokens_per_5h),
            ("tokens_per_24h", l.tokens_per_24h),
            ("tokens_per_week", l.tokens_per_week),
            ("usd_per_5h", l.usd_per_5h),
            ("usd_per_24h", l.usd_per_24h),
            ("usd_per_week", l.usd_per_week),
        ]
    };
    let found =
        pairs(before)
            .into_iter()
            .zip(pairs(after))
            .find_map(|((field, b), (_, a))| match (b, a) {
                (Some(_), None) => Some(field),
                (Some(b), Some(a)) if a > b => Some(field),
                _ => None,
            });
    // Unset: every cached token counts in full.
    let weight = |l: &Limits| l.cache_read_weight.unwrap_or(1000);
    found.or((weight(after) < weight(before)).then_some("cache_read_weight"))
}

/// A descendant's change: nothing looser than the root. Judged on what
/// the change sets: a descendant made looser by someone else before (the
/// operator's token) may still be changed in its other fields.
fn descendant_change(
    root: &TenantPolicy,
    before: Option<&TenantPolicy>,
    t: &TenantPolicy,
) -> Option<Loosened> {
    let changed = |f: &dyn Fn(&TenantPolicy) -> bool| before.is_none_or(|b| !f(b));
    let looser = |param: &str, why: String| {
        refuse(
            param.to_string(),
            format!(
                "{why}; this admin token is limited to tenant {:?} and cannot set a tenant below it looser than {:?} itself",
                root.name, root.name
            ),
        )
    };
    let open = |x: &TenantPolicy| x.on_store_error == OnStoreError::FailOpen;
    if open(t) && !open(root) && changed(&open) {
        return looser(
            "on_store_error",
            format!(
                "tenant {:?} would be \"fail_open\" (the default when unset) under tenant {:?}, which is \"fail_closed\": set \"fail_closed\"",
                t.name, root.name
            ),
        );
    }
    if t.shadow && changed(&|x: &TenantPolicy| x.shadow) {
        return looser(
            "shadow",
            format!(
                "tenant {:?} cannot be in shadow mode (its limits and those of {:?} would not be enforced for its requests)",
                t.name, root.name
            ),
        );
    }
    // Whole-cap reservation: nothing of it can be looser.
    let te = t.output_reservation.expected()?;
    let same = |x: &TenantPolicy| x.output_reservation == t.output_reservation;
    if !changed(&same) {
        return None;
    }
    let Some(re) = root.output_reservation.expected() else {
        return looser(
            "output_reservation",
            format!(
                "tenant {:?} cannot reserve the \"expected\" output under tenant {:?}, which reserves the whole cap (\"cap\")",
                t.name, root.name
            ),
        );
    };
    if !within(te.max_exposure, re.max_exposure) {
        return looser(
            "max_exposure",
            format!(
                "tenant {:?} would allow {} of exposure, above the {} of tenant {:?} (give it in the same unit, at most that)",
                t.name,
                te.max_exposure.describe(),
                re.max_exposure.describe(),
                root.name
            ),
        );
    }
    if te.quantile_permille < re.quantile_permille {
        return looser(
            "expected_quantile",
            format!(
                "tenant {:?} would reserve the {} quantile of outputs, below the {} of tenant {:?}",
                t.name,
                f64::from(te.quantile_permille) / 1000.0,
                f64::from(re.quantile_permille) / 1000.0,
                root.name
            ),
        );
    }
    None
}

/// Whether exposure `e` is at most `bound`. Tokens and a share of each
/// budget compare only by budget; given in the other unit, `e` is
/// refused (no budget size makes it safe for every budget).
fn within(e: MaxExposure, bound: MaxExposure) -> bool {
    match (e, bound) {
        (MaxExposure::Tokens(e), MaxExposure::Tokens(b)) => e <= b,
        (MaxExposure::Percent(e), MaxExposure::Percent(b)) => e <= b,
        (MaxExposure::Tokens(0), _) | (MaxExposure::Percent(0), _) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(tpm: Option<u64>, burst: Option<u64>) -> Limits {
        Limits {
            tpm,
            tpm_burst: burst,
            ..Limits::default()
        }
    }

    #[test]
    fn a_limit_raised_or_removed_is_found_lowered_or_added_is_not() {
        let b = limits(Some(1000), None);
        assert_eq!(raised(&b, &limits(Some(2000), None)), Some("tpm"));
        assert_eq!(raised(&b, &limits(None, None)), Some("tpm"));
        assert_eq!(raised(&b, &limits(Some(500), None)), None);
        assert_eq!(raised(&Limits::default(), &b), None);
        // An unset burst is the rate: set above it, it raises the bucket.
        assert_eq!(
            raised(&b, &limits(Some(1000), Some(5000))),
            Some("tpm_burst")
        );
        assert_eq!(raised(&b, &limits(Some(1000), Some(1000))), None);
        let w = |x| Limits {
            cache_read_weight: x,
            ..Limits::default()
        };
        assert_eq!(raised(&w(None), &w(Some(100))), Some("cache_read_weight"));
        assert_eq!(raised(&w(Some(100)), &w(None)), None);
    }

    #[test]
    fn exposure_compares_in_one_unit_only() {
        use MaxExposure::*;
        assert!(within(Tokens(10), Tokens(10)));
        assert!(!within(Tokens(11), Tokens(10)));
        assert!(within(Percent(5), Percent(10)));
        assert!(!within(Percent(11), Percent(10)));
        assert!(!within(Tokens(1), Percent(10)));
        assert!(!within(Percent(1), Tokens(10)));
        assert!(within(Tokens(0), Percent(10)));
    }
}
