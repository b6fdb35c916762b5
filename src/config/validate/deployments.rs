//! Validation of `[[upstreams]]` and `[[models]]`.

use std::collections::HashMap;

use super::V;
use crate::config::raw::RawConfig;
use crate::config::*;
use crate::reserve::keys::is_valid_id;

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
            other => {
                v.err(
                    format!("{path}.kind"),
                    format!("must be \"openai\", \"azure\" or \"self_hosted\", not {other:?}"),
                );
                UpstreamKind::Openai
            }
        };
        match reqwest::Url::parse(&u.base_url) {
            Ok(url) if url.scheme() == "http" || url.scheme() == "https" => {}
            _ => v.err(
                format!("{path}.base_url"),
                format!("not an http(s) URL: {:?}", u.base_url),
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
        let forward_client_headers = super::forwarding::forwarded_headers(
            v,
            &path,
            &u.forward_client_headers,
            &u.forward_credential_headers,
        );
        let limits = v.limits(&format!("{path}.limits"), &u.limits);
        for (field, set) in [
            ("tokens_per_day", limits.tokens_per_day),
            ("tokens_per_month", limits.tokens_per_month),
            ("requests_per_day", limits.requests_per_day),
        ] {
            if set.is_some() {
                v.err(
                    format!("{path}.limits.{field}"),
                    "quotas apply to tenants, not upstreams",
                );
            }
        }
        upstreams.push(UpstreamPolicy {
            name: u.name.clone(),
            kind,
            base_url: u.base_url.trim_end_matches('/').to_string(),
            api_key,
            api_version: u.api_version.clone(),
            limits,
            refund_unused: u.refund_unused.unwrap_or(kind == UpstreamKind::SelfHosted),
            max_tokens_only: u.max_tokens_only.unwrap_or(false),
            supports_n: u.supports_n.unwrap_or(true),
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
        });
    }

    (upstreams, upstream_index)
}

/// Validates `[[models]]` against the upstreams; returns them and their index by name.
pub(super) fn models(
    v: &mut V,
    raw: &RawConfig,
    upstream_index: &HashMap<String, usize>,
) -> (Vec<ModelPolicy>, HashMap<String, usize>) {
    let mut models = Vec::new();
    let mut model_index = HashMap::new();
    for (i, m) in raw.models.iter().enumerate() {
        let path = format!("models[{i}]");
        if m.name.is_empty() {
            v.err(format!("{path}.name"), "must not be empty");
        }
        if model_index.insert(m.name.clone(), i).is_some() {
            v.err(
                format!("{path}.name"),
                format!("duplicate model {:?}", m.name),
            );
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
        let max_out = v
            .positive(
                &format!("{path}.max_output_tokens"),
                m.max_output_tokens,
                MAX_LIMIT,
            )
            .unwrap_or(default_out.max(16_384));
        if default_out > max_out {
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
        let responses = responses_route(v, &path, m, &ups, &raw.upstreams);
        models.push(ModelPolicy {
            name: m.name.clone(),
            upstreams: ups,
            upstream_model: m.upstream_model.clone().unwrap_or_else(|| m.name.clone()),
            encoding,
            default_max_output_tokens: default_out,
            max_output_tokens: max_out,
            reasoning: m.reasoning.unwrap_or(false),
            routing,
            responses,
            hosted_tools: m.hosted_tools.clone(),
            allow_background: m.allow_background.unwrap_or(false),
        });
    }

    (models, model_index)
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
