//! The byte-exact body rewrite of the forward phase: the client's body
//! goes upstream with only the gateway's fields changed (model name,
//! output cap, usage reporting for streams); every other value is copied
//! byte for byte, in the client's order.

use std::borrow::Cow;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::prepare::Prepared;
use crate::config::{ModelPolicy, UpstreamKind, UpstreamPolicy};
use crate::dialects::json_scan::Scan;
use crate::dialects::usage::UsageBounds;
use crate::dialects::Dialect;

/// The body to send to `upstream`: model name, output cap (DESIGN
/// section 1.6), and usage reporting for streams. Everything else passes
/// through untouched.
pub fn upstream_body(
    p: &Prepared,
    model: &ModelPolicy,
    dialect: Dialect,
    upstream: &UpstreamPolicy,
) -> Result<Vec<u8>, serde_json::Error> {
    if dialect == Dialect::Gemini {
        return super::gemini::upstream_body(p, model);
    }
    let name = p.upstream_model(model);
    // Prepare kept only deployments with an id for the model.
    let id = upstream
        .model_id(model, name)
        .unwrap_or(Cow::Borrowed(name));
    let mut out = rewrite(p, (model, &*id), dialect, upstream)?;
    match (p.max_tool_calls, dialect) {
        (Some(_), Dialect::Messages) => {
            let tools = server_tool_max_uses(&out, model)?;
            out = set_member(&out, "tools", &tools)?;
        }
        (Some(calls), _) => {
            out = set_member(&out, "max_tool_calls", &calls.to_string())?;
        }
        (None, _) => {}
    }
    Ok(out)
}

/// The `tools` of Messages body `body` with `max_uses` set on each server
/// tool `model` prices ([`super::hosted_tools::server_tool_max_uses`]: the
/// model's maximum, a client's value lowered to it); every other tool
/// and member copied byte for byte.
fn server_tool_max_uses(body: &[u8], model: &ModelPolicy) -> Result<String, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Tools<'a> {
        #[serde(borrow)]
        tools: Vec<&'a RawValue>,
    }
    let Tools { tools } = serde_json::from_slice(body)?;
    let mut out = String::with_capacity(body.len().min(1 << 16));
    out.push('[');
    for (i, raw) in tools.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let tool: Value = serde_json::from_str(raw.get())?;
        let priced = tool
            .get("type")
            .and_then(Value::as_str)
            .and_then(|ty| super::hosted_tools::priced_server_tool(model, ty));
        match priced {
            Some(_) => {
                let n = super::hosted_tools::server_tool_max_uses(model, &tool);
                let edited = set_member(raw.get().as_bytes(), "max_uses", &n.to_string())?;
                out.push_str(&String::from_utf8_lossy(&edited));
            }
            None => out.push_str(raw.get()),
        }
    }
    out.push(']');
    Ok(out)
}

/// `body` (a JSON object) with member `key` set to the raw JSON `value`,
/// every other member copied byte for byte in order. Only requests that
/// use a priced hosted tool pay this second pass.
fn set_member(body: &[u8], key: &str, value: &str) -> Result<Vec<u8>, serde_json::Error> {
    let top = raw_members(body)?;
    let mut out = Vec::with_capacity(body.len() + key.len() + value.len() + 4);
    out.push(b'{');
    for (k, v) in top.iter().filter(|(k, _)| k != key) {
        serde_json::to_writer(&mut out, k.as_ref())?;
        out.push(b':');
        out.extend_from_slice(v.as_bytes());
        out.push(b',');
    }
    serde_json::to_writer(&mut out, key)?;
    out.push(b':');
    out.extend_from_slice(value.as_bytes());
    out.push(b'}');
    Ok(out)
}

/// [`upstream_body`] without the hosted tools' limits: the client's body
/// (a JSON object) with the model name, the output cap (a clamped cap
/// replaces the client's in every dialect) and usage reporting. `model`
/// is the entry and the name it goes upstream as.
pub fn rewrite(
    p: &Prepared,
    (model, upstream_model): (&ModelPolicy, &str),
    dialect: Dialect,
    upstream: &UpstreamPolicy,
) -> Result<Vec<u8>, serde_json::Error> {
    let (raw, estimate, clamped, stream) = (&p.raw[..], &p.estimate, p.clamped, p.stream);
    // An uncapped request with a known bound goes upstream uncapped unless
    // the budgets cannot hold it: every API served uncapped here lets a
    // request go without a cap (a Messages body always carries its
    // `max_tokens`).
    let uncapped = p.uncapped_bound(model).is_some_and(|b| !b.sent);
    // Top-level fields as raw JSON slices, in the client's order: values
    // are copied byte for byte, never re-serialised (a 400 KB prompt costs
    // a scan, not a rebuild).
    let top = raw_members(raw)?;
    let mut removed: Vec<&str> = Vec::new();
    let mut set: Vec<(&str, String)> = if crate::upstreams::gemini::vertex_openai(upstream) {
        // Gemini on Vertex's OpenAI-compatible endpoint: the model in the
        // body, its publisher first.
        let named = crate::upstreams::gemini::vertex_openai_model(upstream_model);
        vec![("model", serde_json::to_string(&named)?)]
    } else if upstream.kind == UpstreamKind::Vertex {
        // Vertex names the model in the URL and the version in the body.
        removed.push("model");
        vec![(
            "anthropic_version",
            serde_json::to_string(crate::config::vertex::ANTHROPIC_VERSION)?,
        )]
    } else {
        vec![("model", serde_json::to_string(upstream_model)?)]
    };
    // Messages: the client's `max_tokens` (required) goes up unchanged,
    // unless it was clamped.
    let cap_field = dialect
        .cap_field(upstream.max_tokens_only)
        .filter(|_| clamped || !dialect.is_anthropic());
    if let Some(cap_field) = cap_field {
        let cap = output_cap(p, model).max(dialect.min_cap());
        if cap_field == "max_tokens" {
            removed.push("max_completion_tokens");
        } else if clamped {
            // Chat: the client's larger cap may be in either field.
            removed.push("max_tokens");
        }
        if !uncapped
            && (estimate.client_max_output.is_none() || cap_field == "max_tokens" || clamped)
        {
            set.push((cap_field, cap.to_string()));
        }
        // Streams carry usage only when asked for (DESIGN section 5).
        if stream && dialect.asks_stream_usage() {
            let mut opts: Map<String, Value> = top
                .iter()
                .rfind(|(k, _)| k == "stream_options")
                .and_then(|(_, r)| serde_json::from_str(r).ok())
                .unwrap_or_default();
            opts.insert("include_usage".into(), Value::Bool(true));
            set.push(("stream_options", serde_json::to_string(&opts)?));
        }
    }
    let mut out = Vec::with_capacity(raw.len() + 128);
    out.push(b'{');
    let mut first = true;
    let mut field = |out: &mut Vec<u8>, key: &str, value: &str| -> Result<(), serde_json::Error> {
        if !first {
            out.push(b',');
        }
        first = false;
        serde_json::to_writer(&mut *out, key)?;
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        Ok(())
    };
    for (k, v) in &top {
        if removed.contains(&k.as_ref()) || set.iter().any(|(s, _)| s == k) {
            continue;
        }
        field(&mut out, k, v)?;
    }
    for (k, v) in &set {
        field(&mut out, k, v)?;
    }
    out.push(b'}');
    Ok(out)
}

/// The output cap per choice of a request: the client's own cap, else
/// the bound of an uncapped answer ([`Prepared::uncapped_bound`]: sent
/// only when the budgets lowered it, but what a stream is extended and
/// enforced up to), else the reserved output (no bound known, or a
/// background response), which is then sent upstream as the cap.
pub fn output_cap(p: &Prepared, model: &ModelPolicy) -> u64 {
    match (p.estimate.client_max_output, p.uncapped_bound(model)) {
        (Some(client), _) => client,
        (None, Some(bound)) => bound.per_choice,
        (None, None) => p.estimate.output_tokens_per_choice,
    }
}

/// The most usage an upstream can report for `p` (DESIGN "The upstream's
/// usage is bounded"): the output bound is the cap [`rewrite`] sends; an
/// uncapped request sent without one is bounded by the model's
/// `max_output_tokens`, else its context window.
pub fn usage_bounds(p: &Prepared, model: &ModelPolicy, dialect: Dialect) -> UsageBounds {
    let sent_uncapped =
        p.estimate.client_max_output.is_none() && p.uncapped_bound(model).is_some_and(|b| !b.sent);
    let cap = dialect
        .cap_field(false)
        .filter(|_| !sent_uncapped)
        .map(|_| output_cap(p, model).max(dialect.min_cap()));
    UsageBounds::new(
        p.estimate.input_tokens,
        cap,
        p.estimate.choices,
        model.max_output_tokens,
        model.context_window,
    )
}

/// The cap the gateway enforces on a stream of `upstream` (DESIGN section
/// 11: the cap we send is the cap we enforce): the cap sent, for upstreams
/// that may ignore it; `None` for `openai` and `azure` deployments, which
/// honour it (the gateway never ends their streams before their finish)
/// and for dialects without output.
pub fn enforced_cap(
    p: &Prepared,
    model: &ModelPolicy,
    dialect: Dialect,
    upstream: &UpstreamPolicy,
) -> Option<u64> {
    match upstream.kind {
        UpstreamKind::Openai
        | UpstreamKind::Azure
        | UpstreamKind::Anthropic
        | UpstreamKind::Bedrock
        | UpstreamKind::Vertex
        | UpstreamKind::Gemini => None,
        UpstreamKind::SelfHosted => dialect
            .cap_field(upstream.max_tokens_only)
            .map(|_| output_cap(p, model).max(dialect.min_cap())),
    }
}

/// A JSON object's members in document order, each value as its raw
/// slice of the input. Names are borrowed unless they hold escapes. (A
/// `BTreeMap<String, &RawValue>` allocated a string and a tree node per
/// member and sorted the forwarded fields.)
struct RawMembers<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

/// The top-level members of the JSON object `raw` as raw spans, in the
/// client's order. The forward-only reader reads them (serde's visitor
/// per member cost more than the copy); where it declines (see
/// [`json_scan`](crate::dialects::json_scan)), serde_json reads them.
fn raw_members(raw: &[u8]) -> Result<Vec<(Cow<'_, str>, &str)>, serde_json::Error> {
    match std::str::from_utf8(raw).ok().and_then(scanned_members) {
        Some(members) => Ok(members),
        None => serde_members(raw),
    }
}

/// [`raw_members`] by serde's rules: what the reader declines, and the
/// reference its tests compare it with.
fn serde_members(raw: &[u8]) -> Result<Vec<(Cow<'_, str>, &str)>, serde_json::Error> {
    let RawMembers(top) = serde_json::from_slice(raw)?;
    Ok(top.into_iter().map(|(k, v)| (k, v.get())).collect())
}

fn scanned_members(src: &str) -> Option<Vec<(Cow<'_, str>, &str)>> {
    let mut s = Scan::new(src);
    let mut members = Vec::with_capacity(16);
    s.object(|s, k| {
        members.push((k, s.raw()?));
        Some(())
    })?;
    s.end()?;
    Some(members)
}

/// An object member's name, borrowed from the input when it can be
/// (serde's `borrow` on a `Cow<str>` copies only a name with escapes).
#[derive(serde::Deserialize)]
struct MemberName<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for RawMembers<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawMembers<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(16);
                while let Some((MemberName(k), v)) = map.next_entry::<MemberName, &RawValue>()? {
                    members.push((k, v));
                }
                Ok(RawMembers(members))
            }
        }
        d.deserialize_map(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialects::json_scan::generate::{object, string, value};
    use proptest::prelude::*;

    fn body() -> BoxedStrategy<String> {
        let body = object(vec![
            ("model", string().boxed()),
            ("messages", value().boxed()),
            (
                "max_tokens",
                any::<u32>().prop_map(|n| n.to_string()).boxed(),
            ),
            ("stream", Just("true".to_string()).boxed()),
            ("n", Just("1e0".to_string()).boxed()),
        ]);
        prop_oneof![8 => body, 1 => value(), 1 => (value(), "[ }a,]{0,2}").prop_map(|(a, t)| a + &t)]
            .boxed()
    }

    #[test]
    fn members_keep_their_order_and_bytes() {
        let raw =
            r#" {"model" : "m","messages":[{"role":"user","content":"a\"b"}], "m\u006fdel":2 } "#;
        let top = raw_members(raw.as_bytes()).expect("an object");
        let want: Vec<(Cow<str>, &str)> = vec![
            ("model".into(), r#""m""#),
            ("messages".into(), r#"[{"role":"user","content":"a\"b"}]"#),
            ("model".into(), "2"),
        ];
        assert_eq!(top, want);
        assert!(scanned_members(raw).is_some(), "read by the reader");
        assert!(raw_members(b"[1]").is_err());
        assert!(raw_members(b"{} {}").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The members read are serde_json's: both refuse, or both give
        /// the same names and spans in the same order.
        #[test]
        fn members_read_as_serde_reads_them(raw in body()) {
            prop_assert_eq!(raw_members(raw.as_bytes()).ok(), serde_members(raw.as_bytes()).ok(), "{}", raw);
        }
    }
}
