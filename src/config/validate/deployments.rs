//! Validation of `[[upstreams]]` and `[[models]]`.

use std::collections::HashMap;
use std::sync::Arc;

use super::V;
use crate::config::betas::{BetaPolicy, BetaRule};
use crate::config::ids::is_valid_id;
use crate::config::model_names::{ModelIndex, NamePattern};
use crate::config::raw::RawConfig;
use crate::config::*;

/// `anthropic-version` sent when neither the client nor the upstream's
/// `anthropic_version` names one (the current version of Anthropic's API,
/// Anthropic API reference, "Versions").
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Default `token_ratio` of Messages models, per mille: Anthropic's
/// tokenizer is not public; docs/API.md gives the measurements this
/// covers and how to calibrate it.
pub const DEFAULT_TOKEN_RATIO: u64 = 1500;

/// Validates `[[upstreams]]`; returns them and their index by name.
pub(super) fn upstreams(
    v: &mut V,
    raw: &RawConfig,
    server: &ServerPolicy,
) -> (Vec<UpstreamPolicy>, HashMap<String, usize>) {
    let mut upstreams = Vec::new();
    let mut upstream_index = HashMap::new();
    for (i, u) in raw.upstreams.iter().enumerate() {
        let path = format!("upstreams[{i}]");
        if !is_valid_id(&u.name) && u.name.is_empty() {
            v.err(format!("{path}.name"), "must not be empty");
        }
        if upstream_index.insert(u.name.clone(), i).is_some() {
            v.err(
                format!("{path}.name"),
                format!("duplicate upstream {:?}", u.name),
            );
        }
        let kind = match u.kind.as_deref().unwrap_or("openai") {
            "openai" => UpstreamKind::Openai,
            "azure" => UpstreamKind::Azure,
            "self_hosted" => UpstreamKind::SelfHosted,
            "anthropic" => UpstreamKind::Anthropic,
            "bedrock" => UpstreamKind::Bedrock,
            "vertex" => UpstreamKind::Vertex,
            "gemini" => UpstreamKind::Gemini,
            other => {
                v.err(
                    format!("{path}.kind"),
                    format!("must be \"openai\", \"azure\", \"self_hosted\", \"anthropic\", \"bedrock\", \"vertex\" or \"gemini\", not {other:?}"),
                );
                UpstreamKind::Openai
            }
        };
        let vertex = super::vertex::settings(v, &path, kind, u);
        let base_url = match (&vertex, u.base_url.is_empty()) {
            (Some(s), true) => crate::config::vertex::default_base_url(&s.region),
            (None, true) if kind == UpstreamKind::Gemini => {
                crate::config::gemini::DEFAULT_BASE_URL.to_string()
            }
            _ => u.base_url.trim_end_matches('/').to_string(),
        };
        if kind == UpstreamKind::Gemini && u.api_key_env.is_none() {
            v.err(
                format!("{path}.api_key_env"),
                "required for kind = \"gemini\" (the Gemini API key of the deployment's project)",
            );
        }
        match reqwest::Url::parse(&base_url) {
            Ok(url) if url.scheme() == "http" || url.scheme() == "https" => {}
            _ => v.err(
                format!("{path}.base_url"),
                format!("not an http(s) URL: {base_url:?}"),
            ),
        }
        let api_key = match &u.api_key_env {
            Some(var) => match std::env::var(var) {
                Ok(k) if !k.is_empty() => Some(k),
                _ => {
                    v.err(
                        format!("{path}.api_key_env"),
                        format!("environment variable {var} is not set"),
                    );
                    None
                }
            },
            None => None,
        };
        if kind == UpstreamKind::Azure && u.api_version.is_none() {
            v.err(
                format!("{path}.api_version"),
                "required for kind = \"azure\"",
            );
        }
        // Claude on Bedrock speaks Messages like Anthropic's own API;
        // Vertex does unless its publisher is Google.
        let anthropic = kind.speaks_messages()
            && vertex
                .as_ref()
                .is_none_or(|s| s.publisher != crate::config::vertex::Publisher::Google);
        // Gemini models, on the Gemini API or on Vertex: their
        // OpenAI-compatible endpoints document `max_tokens` (Vertex reads
        // `max_completion_tokens` as its alias; the Gemini API's page
        // names only `max_tokens`), and they take Google's attribution
        // headers.
        let gemini = kind == UpstreamKind::Gemini
            || vertex
                .as_ref()
                .is_some_and(|s| s.publisher == crate::config::vertex::Publisher::Google);
        let bedrock = match kind {
            UpstreamKind::Bedrock => crate::config::bedrock::BedrockSettings::from_raw(
                &format!("{path}.bedrock"),
                u.bedrock.as_ref(),
                u.api_key_env.is_some(),
                &mut |p, m| v.err(p, m),
            ),
            _ => {
                if u.bedrock.is_some() {
                    v.err(format!("{path}.bedrock"), "only for kind = \"bedrock\"");
                }
                None
            }
        };
        let models = u.models.as_ref().map(|m| {
            for (name, id) in m {
                if name.is_empty() || id.trim().is_empty() {
                    v.err(
                        format!("{path}.models"),
                        format!("{name:?} = {id:?}: a public name and a non-empty id"),
                    );
                }
            }
            crate::config::deployment_models::DeploymentModels(m.clone())
        });
        let output_token_weight = match u.output_token_weight {
            None => 1,
            Some(w) if (1..=100).contains(&w) => w as u64,
            Some(w) => {
                v.err(
                    format!("{path}.output_token_weight"),
                    format!("must be 1 to 100, not {w}"),
                );
                1
            }
        };
        if anthropic {
            // Anthropic has no api-version query, always takes `max_tokens` and has no `n`.
            for (field, set) in [
                ("api_version", u.api_version.is_some()),
                ("max_tokens_only", u.max_tokens_only.is_some()),
                ("supports_n", u.supports_n.is_some()),
            ] {
                if set {
                    v.err(
                        format!("{path}.{field}"),
                        format!(
                            "not a setting of kind = {:?}",
                            u.kind.as_deref().unwrap_or_default()
                        ),
                    );
                }
            }
        }
        if kind != UpstreamKind::Anthropic && u.anthropic_version.is_some() {
            v.err(
                format!("{path}.anthropic_version"),
                "only for kind = \"anthropic\"",
            );
        }
        let mut forward_client_headers = super::forwarding::forwarded_headers(
            v,
            &path,
            &u.forward_client_headers,
            &u.forward_credential_headers,
        );
        if gemini {
            super::forwarding::add_attribution(&mut forward_client_headers);
        }
        let limits = v.limits(&format!("{path}.limits"), &u.limits);
        for (field, set) in [
            ("tokens_per_day", limits.tokens_per_day),
            ("tokens_per_month", limits.tokens_per_month),
            ("requests_per_day", limits.requests_per_day),
            ("usd_per_day", limits.usd_per_day),
            ("usd_per_month", limits.usd_per_month),
            ("usd_per_5h", limits.usd_per_5h),
            ("usd_per_24h", limits.usd_per_24h),
            ("usd_per_week", limits.usd_per_week),
        ] {
            if set.is_some() {
                v.err(
                    format!("{path}.limits.{field}"),
                    "quotas apply to tenants, not upstreams",
                );
            }
        }
        if limits.cache_read_weight.is_some() {
            v.err(
                format!("{path}.limits.cache_read_weight"),
                "upstream budgets count cache reads as the provider does (see anthropic_cache_reads_count on models)",
            );
        }
        let price = v.price_table(&path, u.price.as_ref(), &u.price_tiers, anthropic);
        upstreams.push(UpstreamPolicy {
            name: u.name.clone(),
            kind,
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
            api_version: u.api_version.clone(),
            anthropic_version: u
                .anthropic_version
                .clone()
                .unwrap_or_else(|| ANTHROPIC_VERSION.into()),
            limits,
            // Anthropic estimates output tokens per minute from max_tokens at
            // the start of a request and adjusts it to the actual output at
            // its end (Anthropic API docs, "Rate limits"): unused output goes
            // back, as on a self-hosted server.
            refund_unused: u.refund_unused.unwrap_or(matches!(
                kind,
                UpstreamKind::SelfHosted
                    | UpstreamKind::Anthropic
                    | UpstreamKind::Bedrock
                    | UpstreamKind::Vertex
                    | UpstreamKind::Gemini
            )),
            max_tokens_only: u.max_tokens_only.unwrap_or(gemini),
            supports_n: u.supports_n.unwrap_or(!anthropic),
            // A request runs at most `max_request` (its hold lives that
            // long plus `settle_retry`): an upstream may not take longer.
            timeout: v
                .secs(&format!("{path}.timeout_secs"), u.timeout_secs, 600)
                .min(server.max_request),
            connect_timeout: v.secs(
                &format!("{path}.connect_timeout_secs"),
                u.connect_timeout_secs,
                10,
            ),
            cooldown: v.secs(&format!("{path}.cooldown_secs"), u.cooldown_secs, 5),
            learn_from_headers: u.learn_from_headers.unwrap_or(false),
            forward_client_headers,
            price,
            models,
            output_token_weight,
            bedrock,
            api_key_env: u.api_key_env.clone(),
            vertex: vertex.map(Arc::new),
            project: u.project.clone(),
        });
    }
    shared_projects(v, &upstreams);
    (upstreams, upstream_index)
}

/// Deployments naming one `project` share its budgets: they must state
/// the same limits (one quota), and the project's name must not be
/// another deployment's (their scopes would be one by accident).
fn shared_projects(v: &mut V, upstreams: &[UpstreamPolicy]) {
    for (i, u) in upstreams.iter().enumerate() {
        let Some(p) = &u.project else { continue };
        let path = format!("upstreams[{i}].project");
        if !is_valid_id(p) {
            v.err(
                path,
                format!("{p:?}: letters, digits, '-', '_' and '.' only"),
            );
            continue;
        }
        if let Some(other) = upstreams
            .iter()
            .find(|o| o.name == *p && o.project.as_deref() != Some(p.as_str()))
        {
            v.err(
                path,
                format!("{p:?} is the name of deployment {:?}, which is not in this project: name the project otherwise", other.name),
            );
            continue;
        }
        if let Some(first) = upstreams[..i]
            .iter()
            .find(|o| o.project.as_deref() == Some(p.as_str()))
        {
            if first.limits != u.limits || first.refund_unused != u.refund_unused {
                v.err(
                    format!("upstreams[{i}].limits"),
                    format!("deployments of project {p:?} share its budgets: state the same limits and refund_unused as {:?}", first.name),
                );
            }
        }
    }
}

/// Validates `[[models]]` against the upstreams; returns them and their index by name.
pub(super) fn models(
    v: &mut V,
    raw: &RawConfig,
    upstream_index: &HashMap<String, usize>,
    upstreams: &[UpstreamPolicy],
    estimation: &crate::config::estimate::EstimateSettings,
) -> (Vec<ModelPolicy>, ModelIndex) {
    let mut models = Vec::new();
    let mut model_index = ModelIndex::default();
    for (i, m) in raw.models.iter().enumerate() {
        let path = format!("models[{i}]");
        if m.name.is_empty() {
            v.err(format!("{path}.name"), "must not be empty");
        }
        let pattern = match NamePattern::parse(&m.name) {
            Ok(p) => p,
            Err(why) => {
                v.err(format!("{path}.name"), format!("{:?}: {why}", m.name));
                NamePattern::Exact(m.name.clone())
            }
        };
        if !model_index.insert(&m.name, &pattern, i) {
            let first = raw
                .models
                .iter()
                .position(|o| o.name == m.name)
                .unwrap_or(i);
            if pattern.is_pattern() {
                v.err(
                    format!("{path}.name"),
                    format!(
                        "pattern {:?} is models[{first}]'s already: one entry per pattern",
                        m.name
                    ),
                );
            } else {
                v.err(
                    format!("{path}.name"),
                    format!("duplicate model {:?}", m.name),
                );
            }
        }
        if m.upstreams.is_empty() {
            v.err(
                format!("{path}.upstreams"),
                "must list at least one upstream",
            );
        }
        let mut ups = Vec::new();
        for (j, name) in m.upstreams.iter().enumerate() {
            match upstream_index.get(name) {
                Some(&idx) => ups.push(idx),
                None => v.err(
                    format!("{path}.upstreams[{j}]"),
                    format!("unknown upstream {name:?}"),
                ),
            }
        }
        let encoding = match &m.encoding {
            Some(e) => Encoding::parse(e).unwrap_or_else(|| {
                v.err(
                    format!("{path}.encoding"),
                    format!("must be \"o200k_base\" or \"cl100k_base\", not {e:?}"),
                );
                Encoding::O200kBase
            }),
            None => Encoding::for_model(&m.name).unwrap_or(Encoding::O200kBase),
        };
        let default_out = v
            .positive(
                &format!("{path}.default_max_output_tokens"),
                m.default_max_output_tokens,
                MAX_LIMIT,
            )
            .unwrap_or(1024);
        // Not configured stays unknown: a default here would refuse caps
        // the provider accepts (Claude Code sends 32000).
        let max_out = v.positive(
            &format!("{path}.max_output_tokens"),
            m.max_output_tokens,
            MAX_LIMIT,
        );
        let context_window = v.positive(
            &format!("{path}.context_window"),
            m.context_window,
            MAX_LIMIT,
        );
        for (j, name) in m.models.iter().enumerate() {
            if !pattern.is_pattern() || !pattern.matches(name) {
                v.err(
                    format!("{path}.models[{j}]"),
                    format!(
                        "{name:?} is not a name the pattern {:?} serves (only a pattern entry lists the names it serves)",
                        m.name
                    ),
                );
            }
        }
        if let Some(max_out) = max_out.filter(|&max| default_out > max) {
            v.err(
                format!("{path}.default_max_output_tokens"),
                format!("must be ≤ max_output_tokens ({max_out})"),
            );
        }
        let routing = match m.routing.as_deref().unwrap_or("priority") {
            "priority" => Routing::Priority,
            "least_utilised" | "least_utilized" => Routing::LeastUtilised,
            other => {
                v.err(
                    format!("{path}.routing"),
                    format!("must be \"priority\" or \"least_utilised\", not {other:?}"),
                );
                Routing::Priority
            }
        };
        let speaks = |&i: &usize| upstreams.get(i).map(UpstreamPolicy::family);
        let family = ups.first().and_then(speaks).unwrap_or(Family::OpenAi);
        if ups.iter().any(|i| speaks(i) != Some(family)) {
            v.err(
                format!("{path}.upstreams"),
                "all deployments of a model must speak one dialect (all \"anthropic\", \"bedrock\" or \"vertex\"; all \"gemini\" or Vertex with publisher \"google\"; or none of these)",
            );
        }
        let messages = family == Family::Messages;
        let gemini = family == Family::Gemini;
        let token_ratio = match m.token_ratio {
            None if gemini => crate::config::gemini::DEFAULT_TOKEN_RATIO,
            None => DEFAULT_TOKEN_RATIO,
            Some(_) if !messages && !gemini => {
                v.err(
                    format!("{path}.token_ratio"),
                    "only for models served by kind = \"anthropic\"",
                );
                1000
            }
            Some(r) => v
                .positive(&format!("{path}.token_ratio"), Some(r), 100_000)
                .unwrap_or(DEFAULT_TOKEN_RATIO),
        };
        let anthropic_only = [
            ("anthropic_betas", !m.anthropic_betas.is_empty()),
            ("anthropic_betas_deny", !m.anthropic_betas_deny.is_empty()),
            ("allow_server_tools", m.allow_server_tools.is_some()),
            ("allow_file_ids", m.allow_file_ids.is_some()),
            (
                "anthropic_cache_reads_count",
                m.anthropic_cache_reads_count.is_some(),
            ),
        ];
        for (field, _) in anthropic_only.iter().filter(|(_, set)| *set && !messages) {
            v.err(
                format!("{path}.{field}"),
                "only for models served by kind = \"anthropic\"",
            );
        }
        let client_cap_reservation = match m.client_cap_reservation.as_deref() {
            None => {
                if messages {
                    CapReservation::Incremental
                } else {
                    CapReservation::Full
                }
            }
            Some("incremental") => CapReservation::Incremental,
            Some("full") => CapReservation::Full,
            Some(other) => {
                v.err(
                    format!("{path}.client_cap_reservation"),
                    format!("must be \"incremental\" or \"full\", not {other:?}"),
                );
                CapReservation::Full
            }
        };
        let responses = responses_route(v, &path, m, &ups, &raw.upstreams);
        let hosted = hosted_tools(v, &path, &m.hosted_tools);
        let price = v
            .price_table(&path, m.price.as_ref(), &m.price_tiers, messages)
            .map(|t| {
                Arc::new(crate::money::PriceTable {
                    hosted: hosted.1,
                    ..crate::money::PriceTable::clone(&t)
                })
            });
        let upstream_model = m.upstream_model.clone().unwrap_or_else(|| m.name.clone());
        models.push(ModelPolicy {
            image: estimation.image_cost(&upstream_model, &m.name),
            name: m.name.clone(),
            pattern: pattern.is_pattern(),
            renamed: m.upstream_model.is_some(),
            upstreams: ups,
            upstream_model,
            encoding,
            default_max_output_tokens: default_out,
            max_output_tokens: max_out,
            context_window,
            listed: m.models.clone(),
            reasoning: m.reasoning.unwrap_or(false),
            routing,
            messages,
            gemini,
            token_ratio: if messages || gemini {
                token_ratio
            } else {
                1000
            },
            client_cap_reservation,
            anthropic_betas: betas(v, &path, m),
            allow_server_tools: m.allow_server_tools.unwrap_or(false),
            allow_file_ids: m.allow_file_ids.unwrap_or(false),
            anthropic_cache_reads_count: m.anthropic_cache_reads_count.unwrap_or(false),
            price,
            responses,
            hosted_tools: hosted.0,
            hosted_prices: hosted.1,
            max_tool_calls: v
                .positive(&format!("{path}.max_tool_calls"), m.max_tool_calls, 1000)
                .unwrap_or(DEFAULT_MAX_TOOL_CALLS),
            hosted_call_input_tokens: v
                .positive(
                    &format!("{path}.hosted_call_input_tokens"),
                    m.hosted_call_input_tokens,
                    MAX_LIMIT,
                )
                .unwrap_or(DEFAULT_HOSTED_CALL_INPUT_TOKENS),
            allow_background: m.allow_background.unwrap_or(false),
        });
    }

    (models, model_index)
}

/// Default `max_tool_calls`: uses of hosted tools one request may make.
pub const DEFAULT_MAX_TOOL_CALLS: u64 = 4;

/// Default `hosted_call_input_tokens`: input reserved per use of a priced
/// hosted tool (docs/MONEY.md: what a web search adds to the context).
pub const DEFAULT_HOSTED_CALL_INPUT_TOKENS: u64 = 4000;

/// `hosted_tools`: the types allowed, and the prices of the priced ones.
fn hosted_tools(
    v: &mut V,
    path: &str,
    raw: &crate::config::raw::RawHostedTools,
) -> (Vec<String>, crate::money::HostedPrices) {
    use crate::config::raw::RawHostedTools;
    use crate::money::{HostedKind, HostedPrices, Per};
    let mut prices = HostedPrices::default();
    match raw {
        RawHostedTools::List(names) => (names.clone(), prices),
        RawHostedTools::Priced(table) => {
            for (name, t) in table {
                let tp = format!("{path}.hosted_tools.{name}");
                let Some(kind) = HostedKind::of_tool_type(name) else {
                    v.err(
                        &tp,
                        format!("the gateway cannot count uses of {name:?} in answers, so cannot price it; allow it unpriced with the list form (hosted_tools = [{name:?}])"),
                    );
                    continue;
                };
                match Per::parse(&t.per) {
                    None => v.err(
                        format!("{tp}.per"),
                        format!(
                            "must be \"call\", \"session\" or \"image\", not {:?}",
                            t.per
                        ),
                    ),
                    Some(per) if per != kind.unit() => v.err(
                        format!("{tp}.per"),
                        format!(
                            "{name} bills per {}, not per {}",
                            kind.unit().name(),
                            per.name()
                        ),
                    ),
                    Some(_) => {
                        if let Some(m) = v.hosted_price(&format!("{tp}.usd"), &t.usd) {
                            prices.set(kind, m);
                        }
                    }
                }
            }
            (table.keys().cloned().collect(), prices)
        }
    }
}

/// The beta policy of model `m`: its allow list when it has one, else
/// every beta but the default deny list and its own additions.
fn betas(v: &mut V, path: &str, m: &crate::config::raw::RawModel) -> BetaPolicy {
    let mut parse = |field: &str, list: &[String]| -> Vec<BetaRule> {
        list.iter()
            .enumerate()
            .filter_map(|(j, b)| match BetaRule::parse(b) {
                Ok(r) => Some(r),
                Err(why) => {
                    v.err(format!("{path}.{field}[{j}]"), format!("{b:?}: {why}"));
                    None
                }
            })
            .collect()
    };
    let allow = parse("anthropic_betas", &m.anthropic_betas);
    let deny = parse("anthropic_betas_deny", &m.anthropic_betas_deny);
    if !m.anthropic_betas.is_empty() {
        if !m.anthropic_betas_deny.is_empty() {
            v.err(
                format!("{path}.anthropic_betas_deny"),
                "has no effect beside anthropic_betas (an allow list: only the betas it names pass)",
            );
        }
        return BetaPolicy::Allow(allow);
    }
    let mut all = crate::config::betas::default_deny();
    all.extend(deny);
    BetaPolicy::Deny(all)
}

/// Whether an upstream of `kind` with `api_version` serves the Responses
/// API: OpenAI and self-hosted OpenAI-compatible servers at
/// `<base>/responses`; Azure OpenAI at `<base>/openai/responses` from
/// `api-version` 2025-03-01-preview on.
pub fn serves_responses(kind: UpstreamKind, api_version: Option<&str>) -> bool {
    match kind {
        UpstreamKind::Azure => {
            api_version.is_some_and(|v| v.get(..10).is_some_and(|d| d >= "2025-03-01"))
        }
        UpstreamKind::Openai | UpstreamKind::SelfHosted => true,
        // Anthropic models answer on /v1/messages only; Gemini's
        // OpenAI-compatible endpoint serves chat completions, not Responses.
        UpstreamKind::Anthropic
        | UpstreamKind::Bedrock
        | UpstreamKind::Vertex
        | UpstreamKind::Gemini => false,
    }
}

/// Whether model `m` is served on `/v1/responses`: as configured
/// (`responses`), by default when every deployment serves it. Asking for it
/// on a deployment that cannot is a load error.
fn responses_route(
    v: &mut V,
    path: &str,
    m: &crate::config::raw::RawModel,
    ups: &[usize],
    raw_upstreams: &[crate::config::raw::RawUpstream],
) -> bool {
    let unsupported = ups.iter().map(|&i| &raw_upstreams[i]).find(|u| {
        let kind = match u.kind.as_deref() {
            Some("azure") => UpstreamKind::Azure,
            Some("self_hosted") => UpstreamKind::SelfHosted,
            Some("anthropic") => UpstreamKind::Anthropic,
            Some("bedrock") => UpstreamKind::Bedrock,
            Some("vertex") => UpstreamKind::Vertex,
            Some("gemini") => UpstreamKind::Gemini,
            _ => UpstreamKind::Openai,
        };
        !serves_responses(kind, u.api_version.as_deref())
    });
    match (m.responses, unsupported) {
        (Some(false), _) => false,
        (Some(true), Some(u)) => {
            v.err(
                format!("{path}.responses"),
                format!(
                    "upstream {:?} cannot serve /v1/responses (Azure needs api_version 2025-03-01-preview or later)",
                    u.name
                ),
            );
            false
        }
        (_, None) => true,
        (None, Some(_)) => false,
    }
}
