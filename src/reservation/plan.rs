//! Which budgets a request touches, from policy: the one place that turns
//! configured [`Limits`] into [`BudgetSpec`]s.

use crate::config::{KeyPolicy, Limits, ModelPolicy, Policy, TenantPolicy, UpstreamPolicy};
use crate::reserve::keys::KeySpace;
use crate::reserve::{BudgetKind, BudgetName, BudgetSpec, Scope, Window};

/// Budgets of one scope under `limits`.
pub fn scope_budgets(
    ks: &KeySpace,
    scope: Scope,
    limits: &Limits,
    refund_unused: bool,
) -> Vec<BudgetSpec> {
    let mut out = Vec::new();
    let mut push = |name: BudgetName, kind: BudgetKind| {
        out.push(BudgetSpec {
            key: ks.budget(&scope, name),
            scope: scope.clone(),
            name,
            kind,
            refund_unused,
            shadow: false,
        });
    };
    if let Some(rpm) = limits.rpm {
        push(
            BudgetName::Rpm,
            BudgetKind::Bucket {
                per_minute: rpm,
                burst: limits.rpm_burst.unwrap_or(rpm),
            },
        );
    }
    if let Some(tpm) = limits.tpm {
        push(
            BudgetName::Tpm,
            BudgetKind::Bucket {
                per_minute: tpm,
                burst: limits.tpm_burst.unwrap_or(tpm),
            },
        );
    }
    if let Some(max) = limits.max_concurrent {
        push(BudgetName::MaxConcurrent, BudgetKind::Concurrency { max });
    }
    if let Some(limit) = limits.tokens_per_day {
        push(
            BudgetName::TokensPerDay,
            BudgetKind::Quota {
                limit,
                window: Window::Day,
            },
        );
    }
    if let Some(limit) = limits.tokens_per_month {
        push(
            BudgetName::TokensPerMonth,
            BudgetKind::Quota {
                limit,
                window: Window::Month,
            },
        );
    }
    if let Some(limit) = limits.requests_per_day {
        push(
            BudgetName::RequestsPerDay,
            BudgetKind::Quota {
                limit,
                window: Window::Day,
            },
        );
    }
    out
}

/// Shadow budgets of one scope: evaluated and debited like the others but
/// never enforced; stored under their own keys.
pub fn shadow_budgets(ks: &KeySpace, scope: Scope, limits: &Limits) -> Vec<BudgetSpec> {
    scope_budgets(ks, scope, limits, true)
        .into_iter()
        .map(|mut s| {
            s.key = ks.shadow_budget(&s.scope, s.name);
            s.shadow = true;
            s
        })
        .collect()
}

/// Budgets shared by every candidate deployment: the key's, then for the
/// tenant and each of its ancestors (nearest first) its tenant scope, its
/// tenant×model scope and its `shadow_limits`. Each level's `shadow` puts
/// that level's budgets in shadow (the key's go with its own tenant); its
/// `shadow_limits` add shadow budgets of its tenant scope.
pub fn tenant_budgets(
    ks: &KeySpace,
    policy: &Policy,
    tenant: &TenantPolicy,
    key: &KeyPolicy,
    model: &ModelPolicy,
) -> Vec<BudgetSpec> {
    let mut out = Vec::new();
    for (depth, level) in policy.lineage(tenant).enumerate() {
        let from = out.len();
        let name = || -> std::sync::Arc<str> { level.name.as_str().into() };
        out.extend(scope_budgets(
            ks,
            Scope::Tenant(name()),
            &level.limits,
            true,
        ));
        if depth == 0 {
            out.extend(scope_budgets(
                ks,
                Scope::Key(name(), key.id.as_str().into()),
                &key.limits,
                true,
            ));
        }
        if let Some(l) = level.model_limits.get(&model.name) {
            out.extend(scope_budgets(
                ks,
                Scope::TenantModel(name(), model.name.as_str().into()),
                l,
                true,
            ));
        }
        if level.shadow {
            for s in &mut out[from..] {
                s.shadow = true;
            }
        }
        out.extend(shadow_budgets(
            ks,
            Scope::Tenant(name()),
            &level.shadow_limits,
        ));
    }
    out
}

/// Budgets of one end user (`hash`, from `config::end_user`) of `tenant`:
/// for the tenant and each ancestor with `end_user_limits`, the scope
/// `end_user:<level>/<hash>` under those limits (one end user is then
/// counted once per level that limits end users, across the level's whole
/// subtree). A level in shadow has its end-user budgets in shadow.
pub fn end_user_budgets(
    ks: &KeySpace,
    policy: &Policy,
    tenant: &TenantPolicy,
    hash: &std::sync::Arc<str>,
) -> Vec<BudgetSpec> {
    let mut out = Vec::new();
    for level in policy.lineage(tenant) {
        if level.end_user_limits.is_empty() {
            continue;
        }
        let scope = Scope::EndUser(level.name.as_str().into(), hash.clone());
        let mut specs = scope_budgets(ks, scope, &level.end_user_limits, true);
        for s in &mut specs {
            s.shadow = level.shadow;
        }
        out.extend(specs);
    }
    out
}

/// Budgets of one upstream deployment.
pub fn upstream_budgets(ks: &KeySpace, upstream: &UpstreamPolicy) -> Vec<BudgetSpec> {
    scope_budgets(
        ks,
        Scope::Upstream(upstream.name.as_str().into()),
        &upstream.limits,
        upstream.refund_unused,
    )
}

/// Candidate budget lists for a model's deployments, in preference order.
pub fn candidate_budgets(
    ks: &KeySpace,
    policy: &Policy,
    model: &ModelPolicy,
) -> Vec<Vec<BudgetSpec>> {
    model
        .upstreams
        .iter()
        .map(|&i| upstream_budgets(ks, &policy.upstreams[i]))
        .collect()
}

/// The smallest token capacity a request must fit: the minimum over the
/// common budgets and the largest over candidates (a request needs only one
/// deployment to fit). `None` when no token budget applies.
pub fn tightest_token_capacity<C: AsRef<[BudgetSpec]>>(
    common: &[BudgetSpec],
    candidates: &[C],
) -> Option<u64> {
    let cap = |specs: &[BudgetSpec]| {
        specs
            .iter()
            .filter(|s| s.name.counts_tokens())
            .map(|s| s.capacity())
            .min()
    };
    let common_cap = cap(common);
    let cand_cap = if candidates.iter().any(|c| cap(c.as_ref()).is_none()) {
        None
    } else {
        candidates.iter().filter_map(|c| cap(c.as_ref())).max()
    };
    match (common_cap, cand_cap) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tree_tests {
    use super::*;
    use crate::reserve::keys::hash_tag;

    /// Four levels (`org` > `dept` > `team` > `app`), each with a few
    /// limits and end-user limits, a per-model limit on the org.
    const TREE: &str = r#"
[store]
domain = "d1"
[[upstreams]]
name = "u"
base_url = "http://127.0.0.1:9/v1"
limits = { rpm = 10, tpm = 1000 }
[[models]]
name = "m"
upstreams = ["u"]
[[tenants]]
name = "org"
limits = { tpm = 100, tokens_per_day = 1000 }
model_limits = { m = { rpm = 5 } }
end_user_limits = { rpm = 3 }
shadow = true
[[tenants]]
name = "dept"
parent = "org"
limits = { rpm = 50 }
[[tenants]]
name = "team"
parent = "dept"
limits = { max_concurrent = 4 }
end_user_limits = { tpm = 30 }
[[tenants]]
name = "app"
parent = "team"
keys = [{ id = "k", sha256 = "0000000000000000000000000000000000000000000000000000000000000000", limits = { rpm = 2 } }]
limits = { tpm = 60 }
"#;

    fn policy() -> Policy {
        // SAFETY (set_var): the one value every test of this binary sets.
        unsafe { std::env::set_var("BUDGETGATE_END_USER_KEY", "unit-test-end-user-key") };
        Policy::from_toml(TREE).unwrap()
    }

    #[test]
    fn a_leaf_reserves_on_every_level_in_one_domain() {
        let p = policy();
        let ks = KeySpace::new(&p.store.key_prefix, &p.store.domain);
        let app = &p.tenants[3];
        let m = p.model("m").unwrap();
        let common = tenant_budgets(&ks, &p, app, &app.keys[0], m);
        let got: Vec<String> = common
            .iter()
            .map(|s| {
                format!(
                    "{} {}{}",
                    s.scope,
                    s.name,
                    if s.shadow { " shadow" } else { "" }
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                "tenant:app tpm",
                "key:app/k rpm",
                "tenant:team max_concurrent",
                "tenant:dept rpm",
                "tenant:org tpm shadow",
                "tenant:org tokens_per_day shadow",
                "tenant_model:org/m rpm shadow",
            ]
        );
        let hash: std::sync::Arc<str> = p.end_user_key.as_ref().unwrap().hash(b"u{1}\n").into();
        let users = end_user_budgets(&ks, &p, app, &hash);
        let got: Vec<String> = users
            .iter()
            .map(|s| format!("{} {} {}", s.scope, s.name, s.shadow))
            .collect();
        assert_eq!(
            got,
            [
                format!("end_user:team/{hash} tpm false"),
                format!("end_user:org/{hash} rpm true"),
            ]
        );
        let upstream = upstream_budgets(&ks, &p.upstreams[0]);
        for s in common.iter().chain(&users).chain(&upstream) {
            assert_eq!(hash_tag(&s.key), Some("d1"), "{}", s.key);
        }
        assert!(p.tenants[0].ancestors.is_empty());
        assert_eq!(app.ancestors, [2, 1, 0]);
        assert!(app.reads_end_user && !app.end_user_required);
        assert_eq!(
            p.requester_of(app).as_deref(),
            Some("tenant app, child of team, child of dept, child of org")
        );
    }
}
