//! Body preparation: a client body (any bytes) is parsed, estimated for
//! each dialect and rewritten for the upstream without a panic; a body
//! that estimates is rewritten into a JSON object carrying the upstream
//! model name, with every other member of the client's body kept.
#![no_main]

use std::sync::LazyLock;

use budgetgate::config::Policy;
use budgetgate::dialects::Dialect;
use budgetgate::estimate::ModelEstimation;
use budgetgate::lifecycle::rewrite::rewrite;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const CONFIG: &str = r#"
[[upstreams]]
name = "local"
kind = "self_hosted"
base_url = "http://127.0.0.1:9"
max_tokens_only = true
[[upstreams]]
name = "cloud"
kind = "openai"
base_url = "http://127.0.0.1:9"
[[models]]
name = "m"
upstream_model = "upstream-m"
upstreams = ["local", "cloud"]
encoding = "o200k_base"
default_max_output_tokens = 64
max_output_tokens = 4096
"#;

static POLICY: LazyLock<Policy> =
    LazyLock::new(|| Policy::from_toml(CONFIG).expect("the fuzz config loads"));

fuzz_target!(|data: &[u8]| {
    let Some((&pick, raw)) = data.split_first() else {
        return;
    };
    let Ok(body) = serde_json::from_slice::<Value>(raw) else {
        return;
    };
    let policy = &*POLICY;
    let model = policy.model("m").expect("model m");
    let dialect = [Dialect::ChatCompletions, Dialect::Completions, Dialect::Embeddings]
        [usize::from(pick % 3)];
    let upstream = &policy.upstreams[usize::from(pick / 3 % 2)];
    let me = ModelEstimation {
        encoding: model.encoding,
        default_max_output_tokens: model.default_max_output_tokens,
        max_output_tokens: model.max_output_tokens,
        min_output_tokens: policy.min_output_tokens,
        token_ratio: 1000,
    };
    let tightest = (pick & 0x80 != 0).then_some(u64::from(pick) * 100);
    let Ok(estimate) = dialect.estimate(&body, &me, &policy.estimation, tightest) else {
        return;
    };
    assert!(estimate.total_tokens >= estimate.input_tokens);
    let stream = body.get("stream") == Some(&Value::Bool(true));
    let out = rewrite(raw, &estimate, stream, model, dialect, upstream)
        .expect("a body that estimates is rewritten");
    let sent: Value = serde_json::from_slice(&out).expect("the rewritten body is JSON");
    assert_eq!(sent["model"], "upstream-m");
    let Value::Object(client) = &body else {
        unreachable!("estimate accepts objects only")
    };
    for (k, v) in client {
        if !matches!(
            k.as_str(),
            "model" | "max_tokens" | "max_completion_tokens" | "stream_options"
        ) {
            assert_eq!(&sent[k], v, "member {k} changed");
        }
    }
});
