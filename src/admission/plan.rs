//! Which budgets a request touches, from policy: the one place that turns
//! configured [`Limits`] into [`BudgetSpec`]s, and says how each counts a
//! request ([`Counting`]: a scope's cache-read weight, a provider's rule).
//! Also which budgets a tenant has ([`tenant_specs`], [`ancestor_specs`]),
//! the one list the budget pages, `GET /v1/budget` and the alert watch read.

use super::amounts::{Counting, FULL_WEIGHT};
use crate::budget::keys::KeySpace;
use crate::budget::{BudgetKind, BudgetName, BudgetSpec, Scope, Window};
use crate::config::run::{RunLimits, RunWindow};
use crate::config::{
    KeyPolicy, Limits, ModelPolicy, Policy, TenantPolicy, UpstreamKind, UpstreamPolicy,
};
use crate::estimate::TokenRoom;

/// The key space of `policy`'s budgets (prefix, domain and layout).
pub fn key_space(policy: &Policy) -> KeySpace {
    KeySpace::new(&policy.store.key_prefix, &policy.store.domain)
        .with_layout(policy.store.layout, policy.placement.clone())
}

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
            key: ks.budget(&scope, name).into(),
            scope: scope.clone(),
            name,
            kind,
            // Providers bill actual usage: dollars always go back to it.
            refund_unused: refund_unused || name.counts_usd(),
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
    for (name, limit, burst) in [
        (
            BudgetName::InputTpm,
            limits.input_tpm,
            limits.input_tpm_burst,
        ),
        (
            BudgetName::OutputTpm,
            limits.output_tpm,
            limits.output_tpm_burst,
        ),
    ] {
        if let Some(per_minute) = limit {
            push(
                name,
                BudgetKind::Bucket {
                    per_minute,
                    burst: burst.unwrap_or(per_minute),
                },
            );
        }
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
    // Dollar budgets: quotas whose unit is the micro-dollar; then the
    // rolling windows (`budget::rolling`), tokens and dollars.
    // A window from first use replaces the rolling one of the same length.
    let (h5, h24, week) = if limits.from_first_use {
        (
            Window::FirstUse5h,
            Window::FirstUse24h,
            Window::FirstUseWeek,
        )
    } else {
        (Window::Hours5, Window::Hours24, Window::Week)
    };
    for (name, limit, window) in [
        (BudgetName::UsdPerDay, limits.usd_per_day, Window::Day),
        (BudgetName::UsdPerMonth, limits.usd_per_month, Window::Month),
        (BudgetName::TokensPer5h, limits.tokens_per_5h, h5),
        (BudgetName::TokensPer24h, limits.tokens_per_24h, h24),
        (BudgetName::TokensPerWeek, limits.tokens_per_week, week),
        (BudgetName::UsdPer5h, limits.usd_per_5h, h5),
        (BudgetName::UsdPer24h, limits.usd_per_24h, h24),
        (BudgetName::UsdPerWeek, limits.usd_per_week, week),
    ] {
        if let Some(limit) = limit {
            push(name, BudgetKind::Quota { limit, window });
        }
    }
    out
}

/// Shadow budgets of one scope: evaluated and debited like the others but
/// never enforced; stored under their own keys.
pub fn shadow_budgets(ks: &KeySpace, scope: Scope, limits: &Limits) -> Vec<BudgetSpec> {
    scope_budgets(ks, scope, limits, true)
        .into_iter()
        .map(|mut s| {
            s.key = ks.shadow_budget(&s.scope, s.name).into();
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
    tenant_plan(ks, policy, tenant, key, model).0
}

/// [`tenant_budgets`] and how each counts: every budget of a scope
/// weights cache reads by the scope's `cache_read_weight` (default: in
/// full); shadow limits by their own, else their tenant's.
pub fn tenant_plan(
    ks: &KeySpace,
    policy: &Policy,
    tenant: &TenantPolicy,
    key: &KeyPolicy,
    model: &ModelPolicy,
) -> (Vec<BudgetSpec>, Vec<Counting>) {
    let mut out = Vec::new();
    let mut counting = Vec::new();
    for (depth, level) in policy.lineage(tenant).enumerate() {
        // A level in shadow mode has every budget of its own in shadow.
        let mut add = |mut specs: Vec<BudgetSpec>, weight: Option<u64>| {
            let c = Counting {
                cache_read_weight: weight.unwrap_or(FULL_WEIGHT),
                whole_cap: false,
                output_weight: 1,
                burndown: false,
            };
            for s in &mut specs {
                s.shadow |= level.shadow;
            }
            counting.extend(specs.iter().map(|_| c));
            out.extend(specs);
        };
        let name = || -> std::sync::Arc<str> { level.name.as_str().into() };
        let l = &level.limits;
        add(
            scope_budgets(ks, Scope::Tenant(name()), l, true),
            l.cache_read_weight,
        );
        if depth == 0 {
            let l = &key.limits;
            let scope = Scope::Key(name(), key.id.as_str().into());
            add(scope_budgets(ks, scope, l, true), l.cache_read_weight);
        }
        if let Some(l) = level.model_limits.get(&model.name) {
            let scope = Scope::TenantModel(name(), model.name.as_str().into());
            add(scope_budgets(ks, scope, l, true), l.cache_read_weight);
        }
        let l = &level.shadow_limits;
        add(
            shadow_budgets(ks, Scope::Tenant(name()), l),
            l.cache_read_weight.or(level.limits.cache_read_weight),
        );
    }
    (out, counting)
}

/// Budgets of one end user (`hash`, from `config::end_user`) of `tenant`
/// and how each counts: for the tenant and each ancestor with
/// `end_user_limits`, the scope `end_user:<level>/<hash>` under those
/// limits (an end user is then counted once per level that limits end
/// users, across that level's whole subtree). A level in shadow has its
/// end-user budgets in shadow.
pub fn end_user_plan(
    ks: &KeySpace,
    policy: &Policy,
    tenant: &TenantPolicy,
    hash: &std::sync::Arc<str>,
) -> (Vec<BudgetSpec>, Vec<Counting>) {
    let mut out = Vec::new();
    let mut counting = Vec::new();
    for level in policy.lineage(tenant) {
        let l = &level.end_user_limits;
        if l.is_empty() {
            continue;
        }
        let scope = Scope::EndUser(level.name.as_str().into(), hash.clone());
        let mut specs = scope_budgets(ks, scope, l, true);
        for s in &mut specs {
            s.shadow = level.shadow;
        }
        let c = Counting {
            cache_read_weight: l.cache_read_weight.unwrap_or(FULL_WEIGHT),
            whole_cap: false,
            output_weight: 1,
            burndown: false,
        };
        counting.extend(specs.iter().map(|_| c));
        out.extend(specs);
    }
    (out, counting)
}

/// Budgets of run `scope` (`Scope::Run`) of `tenant` under its effective
/// `limits` (`config::run`): one rolling quota per field set, in the
/// run's window; and how each counts (in full, as a tenant's). A tenant in
/// shadow has its runs' budgets in shadow.
pub fn run_plan(
    ks: &KeySpace,
    tenant: &TenantPolicy,
    scope: &Scope,
    limits: &RunLimits,
) -> (Vec<BudgetSpec>, Vec<Counting>) {
    let window = run_window(limits.window());
    let specs: Vec<BudgetSpec> = run_budgets(limits)
        .map(|(name, limit)| BudgetSpec {
            key: ks.budget(scope, name).into(),
            scope: scope.clone(),
            name,
            kind: BudgetKind::Quota { limit, window },
            refund_unused: true,
            shadow: tenant.shadow,
        })
        .collect();
    let c = Counting {
        cache_read_weight: FULL_WEIGHT,
        whole_cap: false,
        output_weight: 1,
        burndown: false,
    };
    let counting = specs.iter().map(|_| c).collect();
    (specs, counting)
}

/// The quota window a run's window counts in.
pub fn run_window(w: RunWindow) -> Window {
    match w {
        RunWindow::Hours5 => Window::Hours5,
        RunWindow::Hours24 => Window::Hours24,
        RunWindow::Week => Window::Week,
    }
}

/// The budgets run limits make: `(name, limit)` of each field set, the
/// name the rolling quota of the run's window (`tokens_per_24h`, …).
pub fn run_budgets(limits: &RunLimits) -> impl Iterator<Item = (BudgetName, u64)> {
    let (t, u, r) = match limits.window() {
        RunWindow::Hours5 => (
            BudgetName::TokensPer5h,
            BudgetName::UsdPer5h,
            BudgetName::RequestsPer5h,
        ),
        RunWindow::Week => (
            BudgetName::TokensPerWeek,
            BudgetName::UsdPerWeek,
            BudgetName::RequestsPerWeek,
        ),
        RunWindow::Hours24 => (
            BudgetName::TokensPer24h,
            BudgetName::UsdPer24h,
            BudgetName::RequestsPer24h,
        ),
    };
    [
        (t, limits.tokens),
        (u, limits.usd_micros),
        (r, limits.requests),
    ]
    .into_iter()
    .filter_map(|(n, l)| Some((n, l?)))
}

/// Every budget of tenant `t`'s own scopes, as the budget pages list them
/// and the alert watch reads them: the tenant scope, each key scope and
/// each tenant×model scope, in that order.
pub fn tenant_specs(policy: &Policy, t: &TenantPolicy) -> Vec<BudgetSpec> {
    let ks = key_space(policy);
    let mut out = scope_budgets(&ks, Scope::Tenant(t.name.as_str().into()), &t.limits, true);
    for k in &t.keys {
        out.extend(scope_budgets(
            &ks,
            Scope::Key(t.name.as_str().into(), k.id.as_str().into()),
            &k.limits,
            true,
        ));
    }
    for (model, limits) in &t.model_limits {
        out.extend(scope_budgets(
            &ks,
            Scope::TenantModel(t.name.as_str().into(), model.as_str().into()),
            limits,
            true,
        ));
    }
    out
}

/// The budgets of tenant `t`'s ancestors that its requests reserve
/// against, as [`tenant_specs`] lists a tenant's own (tenant scope, then
/// the tenant×model scopes; no keys): nearest first, one list per ancestor.
pub fn ancestor_specs<'p>(policy: &'p Policy, t: &TenantPolicy) -> Vec<(&'p str, Vec<BudgetSpec>)> {
    let ks = key_space(policy);
    t.ancestors
        .iter()
        .map(|&i| {
            let a = &policy.tenants[i];
            let scope = Scope::Tenant(a.name.as_str().into());
            let mut specs = scope_budgets(&ks, scope, &a.limits, true);
            for (model, limits) in &a.model_limits {
                let scope = Scope::TenantModel(a.name.as_str().into(), model.as_str().into());
                specs.extend(scope_budgets(&ks, scope, limits, true));
            }
            if a.shadow {
                for s in &mut specs {
                    s.shadow = true;
                }
            }
            (a.name.as_str(), specs)
        })
        .collect()
}

/// Budgets of one upstream deployment.
pub fn upstream_budgets(ks: &KeySpace, upstream: &UpstreamPolicy) -> Vec<BudgetSpec> {
    scope_budgets(
        ks,
        Scope::Upstream(upstream.budget_scope().into()),
        &upstream.limits,
        upstream.refund_unused,
    )
}

/// How the budgets `specs` of `upstream` count a request of `model`: as
/// the provider counts its own rate limits. Only the per-minute token
/// budgets follow the provider; the others count like a tenant's.
///
/// - Cache reads: `openai`, `azure` and `self_hosted` count cached input
///   in full (OpenAI's `cached_tokens` are inside `prompt_tokens`, which
///   its rate limits count); Anthropic's input limits leave
///   `cache_read_input_tokens` out on current models, so an `anthropic`
///   deployment's `tpm` and `input_tpm` weight them 0, unless the model
///   sets `anthropic_cache_reads_count` (older models count them).
/// - Output: `openai`, `azure` and `anthropic` count a request's
///   `max_tokens` at its start (OpenAI and Azure against TPM; Anthropic
///   against OTPM, adjusted at the end), so `tpm` and `output_tpm` reserve
///   the client's whole cap even where the tenant's budgets reserve a
///   stream's cap incrementally; a `self_hosted` server counts what it
///   generates.
/// - Bedrock ([`Counting::burndown`]): AWS reserves input, cache tokens
///   and `max_tokens` at the start and charges input, cache writes and
///   the burndown weight (`output_token_weight`) times the output at the
///   end, so a `bedrock` deployment's `tpm` and `output_tpm` reserve the
///   whole input and cap once and settle the weighted output.
pub fn upstream_counting(
    specs: &[BudgetSpec],
    upstream: &UpstreamPolicy,
    model: &ModelPolicy,
) -> Vec<Counting> {
    let reads = match upstream.kind {
        UpstreamKind::Anthropic | UpstreamKind::Bedrock | UpstreamKind::Vertex
            if !model.anthropic_cache_reads_count =>
        {
            0
        }
        _ => FULL_WEIGHT,
    };
    let counts_cap_at_start = upstream.kind != UpstreamKind::SelfHosted;
    specs
        .iter()
        .map(|s| Counting {
            cache_read_weight: match s.name {
                BudgetName::Tpm | BudgetName::InputTpm => reads,
                _ => FULL_WEIGHT,
            },
            whole_cap: counts_cap_at_start
                && matches!(s.name, BudgetName::Tpm | BudgetName::OutputTpm),
            output_weight: match s.name {
                BudgetName::Tpm | BudgetName::OutputTpm => upstream.output_token_weight,
                _ => 1,
            },
            burndown: upstream.kind == UpstreamKind::Bedrock
                && matches!(s.name, BudgetName::Tpm | BudgetName::OutputTpm),
        })
        .collect()
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

/// The room a request's default output must fit ([`TokenRoom`]): per
/// dimension (input + output; output alone), the minimum over the common
/// budgets and the largest over candidates (a request needs only one
/// deployment to fit).
pub fn token_room<C: AsRef<[BudgetSpec]>>(common: &[BudgetSpec], candidates: &[C]) -> TokenRoom {
    TokenRoom {
        total: tightest(common, candidates, |n| {
            n.counts_tokens() && !matches!(n, BudgetName::InputTpm | BudgetName::OutputTpm)
        }),
        output: tightest(common, candidates, |n| n == BudgetName::OutputTpm),
    }
}

/// The smallest capacity among budgets named `which` a request must fit:
/// the minimum over `common` and the largest over `candidates`.
fn tightest<C: AsRef<[BudgetSpec]>>(
    common: &[BudgetSpec],
    candidates: &[C],
    which: impl Fn(BudgetName) -> bool,
) -> Option<u64> {
    let cap = |specs: &[BudgetSpec]| {
        specs
            .iter()
            .filter(|s| which(s.name))
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
mod tree_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;

    const CONFIG: &str = r#"
[[upstreams]]
name = "claude"
kind = "anthropic"
base_url = "https://api.anthropic.com"
limits = { tpm = 100000, input_tpm = 40000, output_tpm = 8000, output_tpm_burst = 16000, rpm = 50 }

[[upstreams]]
name = "oai"
kind = "openai"
base_url = "https://api.openai.com/v1"
limits = { tpm = 100000, output_tpm = 9000 }

[[upstreams]]
name = "vllm"
kind = "self_hosted"
base_url = "http://127.0.0.1:1/v1"
limits = { tpm = 100000 }

[[models]]
name = "claude-new"
upstreams = ["claude"]

[[models]]
name = "claude-old"
upstreams = ["claude"]
anthropic_cache_reads_count = true

[[models]]
name = "gpt"
upstreams = ["oai", "vllm"]

[[tenants]]
name = "t"
keys = [{ id = "k", sha256 = "0000000000000000000000000000000000000000000000000000000000000000" }]
limits = { tpm = 1000, input_tpm = 500, cache_read_weight = 100 }
model_limits = { gpt = { output_tpm = 50 } }
"#;

    fn counting(policy: &Policy, upstream: &str, model: &str) -> Vec<(BudgetName, u64, bool)> {
        let ks = KeySpace::new("p", "d");
        let u = policy
            .upstreams
            .iter()
            .find(|u| u.name == upstream)
            .unwrap();
        let m = policy.model(model).unwrap();
        let specs = upstream_budgets(&ks, u);
        upstream_counting(&specs, u, m)
            .into_iter()
            .zip(specs)
            .map(|(c, s)| (s.name, c.cache_read_weight, c.whole_cap))
            .collect()
    }

    #[test]
    fn upstream_budgets_count_as_their_provider() {
        let p = Policy::from_toml(CONFIG).unwrap();
        use BudgetName::*;
        assert_eq!(
            counting(&p, "claude", "claude-new"),
            vec![
                (Rpm, 1000, false),
                (Tpm, 0, true),
                (InputTpm, 0, false),
                (OutputTpm, 1000, true)
            ]
        );
        assert_eq!(
            counting(&p, "claude", "claude-old"),
            vec![
                (Rpm, 1000, false),
                (Tpm, 1000, true),
                (InputTpm, 1000, false),
                (OutputTpm, 1000, true)
            ]
        );
        assert_eq!(
            counting(&p, "oai", "gpt"),
            vec![(Tpm, 1000, true), (OutputTpm, 1000, true)]
        );
        assert_eq!(counting(&p, "vllm", "gpt"), vec![(Tpm, 1000, false)]);
        let ks = KeySpace::new("p", "d");
        let claude = upstream_budgets(&ks, &p.upstreams[0]);
        assert_eq!(
            claude[3].kind,
            BudgetKind::Bucket {
                per_minute: 8000,
                burst: 16000
            }
        );
    }

    #[test]
    fn tenant_side_budgets_weight_cache_reads_per_scope() {
        let p = Policy::from_toml(CONFIG).unwrap();
        let t = &p.tenants[0];
        let ks = KeySpace::new("p", "d");
        let (specs, counting) = tenant_plan(&ks, &p, t, &t.keys[0], p.model("gpt").unwrap());
        let got: Vec<(BudgetName, u64)> = specs
            .iter()
            .zip(&counting)
            .map(|(s, c)| (s.name, c.cache_read_weight))
            .collect();
        use BudgetName::*;
        assert_eq!(got, vec![(Tpm, 100), (InputTpm, 100), (OutputTpm, 1000)]);
        assert!(counting.iter().all(|c| !c.whole_cap));
        let room = token_room(&specs, &[upstream_budgets(&ks, &p.upstreams[1])]);
        assert_eq!(
            room,
            TokenRoom {
                total: Some(1000),
                output: Some(50)
            }
        );
    }

    #[test]
    fn upstreams_cannot_set_a_cache_read_weight() {
        let bad = CONFIG.replace(
            "limits = { tpm = 100000 }",
            "limits = { tpm = 100000, cache_read_weight = 0 }",
        );
        let e = Policy::from_toml(&bad).unwrap_err();
        assert!(
            e.0.iter()
                .any(|m| m.starts_with("upstreams[2].limits.cache_read_weight:")),
            "{e}"
        );
        let bad = CONFIG.replace("cache_read_weight = 100", "cache_read_weight = 1001");
        assert!(Policy::from_toml(&bad).is_err());
        let bad = CONFIG.replace("output_tpm = 9000", "output_tpm_burst = 9000");
        let e = Policy::from_toml(&bad).unwrap_err();
        assert!(
            e.0.iter()
                .any(|m| m.ends_with("output_tpm_burst: needs output_tpm")),
            "{e}"
        );
    }
}
