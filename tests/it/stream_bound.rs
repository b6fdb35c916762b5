//! The bound-first relay against the exact one through the whole gateway:
//! the same streams (chat completions, Responses, Messages at
//! `token_ratio` 1000 and 1500), cut off by the tenant's daily quota or
//! completed, with and without the upstream's usage, on the memory store
//! and on Redis, through a gateway with `estimation.stream_counting =
//! "exact"` and one with the default `"bound"`. Each pair must deliver the
//! same events (ids and timestamps aside) and settle the same tokens.
//! The random-text, random-chunking property is `relay::differential`'s.
//!
//! Run: `cargo test --test it stream_bound::`.

use budgetgate::budget::BudgetName;
use serde_json::{json, Value};

use crate::redis_lost_replies::DelayProxy;
use crate::support::mock_upstream::{Fault, MockUpstream};
use crate::support::redis_server;
use crate::support::*;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Store {
    Memory,
    Redis,
    /// Redis with every command held 100 ms on its way (a loaded machine).
    SlowRedis,
}

/// One stream to compare.
struct Scenario {
    path: &'static str,
    body: Value,
    /// `x-mock-messages` scenario (Messages).
    messages: &'static str,
    /// Tokens the mock streams.
    output: u64,
    /// The tenant's daily quota.
    quota: u64,
    fault: Option<Fault>,
    ratio: u64,
}

fn config(mock: &MockUpstream, s: &Scenario, counting: &str, redis: Option<&str>) -> TestConfig {
    let mut c = TestConfig::standard(&mock.base_url(), 20, limits().tokens_per_day(s.quota));
    c.estimation.stream_extension_step = Some(8);
    c.estimation.stream_counting = Some(counting.into());
    c.upstreams.push(config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        forward_client_headers: vec!["x-mock-messages".into()],
        ..config::upstream("claude", Kind::Anthropic, &mock.root_url())
    });
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        // Reserved 16 at first (the client's cap is reserved
        // incrementally), then extended 8 at a time until the quota ends.
        default_max_output_tokens: Some(16),
        max_output_tokens: Some(64000),
        token_ratio: Some(s.ratio as i64),
        ..config::model("claude-test", &["claude"])
    });
    if let Some(url) = redis {
        // A 2 s store timeout and a fail-closed tenant: with the default
        // 50 ms, a Redis call slowed by a loaded machine had the fail-open
        // limiter admit, extend and settle the stream in the gateway alone,
        // and the quota read from Redis said 0 tokens settled.
        let prefix = format!("bgbound{}", uuid::Uuid::new_v4().simple());
        c = c.redis_fleet(url, &prefix);
    }
    c
}

/// The stream's events with ids and timestamps blanked.
fn normalised(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = String::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        match serde_json::from_str::<Value>(data) {
            Ok(mut v) => {
                blank(&mut v);
                out.push_str(&format!("data: {v}\n"));
            }
            Err(_) => out.push_str(&format!("{line}\n")),
        }
    }
    out
}

fn blank(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if matches!(
                    k.as_str(),
                    "id" | "created" | "created_at" | "item_id" | "response_id"
                ) {
                    *x = Value::Null;
                } else {
                    blank(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(blank),
        _ => {}
    }
}

/// Streams `s` through a fresh gateway: the normalised events and the
/// tokens settled against the quota.
async fn stream(s: &Scenario, counting: &str, store: Store) -> (String, u64) {
    let mock = start_mock().await;
    mock.state.set_output_tokens(s.output);
    mock.state.set_fault(s.fault);
    let proxy = match store {
        Store::SlowRedis => {
            let proxy = DelayProxy::start(redis_server::shared().port()).await;
            proxy.set_delay(100);
            Some(proxy)
        }
        _ => None,
    };
    let url = match (&proxy, store) {
        (Some(p), _) => Some(p.url()),
        (None, Store::Redis) => Some(redis_server::shared().url()),
        (None, _) => None,
    };
    let gw = config(&mock, s, counting, url.as_deref()).start().await;
    let r = reqwest::Client::new()
        .post(format!("{}{}", gw.base_url(), s.path))
        .bearer_auth(KEY)
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header("x-mock-messages", s.messages)
        .json(&s.body)
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), 200, "{}", s.path);
    let body = r.bytes().await.unwrap_or_default();
    match store {
        Store::Memory => gw.all_settled().await,
        Store::Redis | Store::SlowRedis => {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            gw.settled().await;
        }
    }
    (
        normalised(&body),
        gw.t1_used(BudgetName::TokensPerDay).await,
    )
}

fn scenarios() -> Vec<(&'static str, Scenario)> {
    let chat = |stream_options: Value| {
        json!({"model": "gpt-4o-mini", "stream": true, "stream_options": stream_options,
               "messages": [{"role": "user", "content": "Tell a long story."}]})
    };
    let responses = json!({"model": "gpt-4o-mini", "stream": true, "input": "Tell a long story."});
    let messages = json!({"model": "claude-test", "stream": true, "max_tokens": 200,
                          "messages": [{"role": "user", "content": "Tell a long story."}]});
    let s = |path, body: &Value, messages, output, quota, fault, ratio| Scenario {
        path,
        body: body.clone(),
        messages,
        output,
        quota,
        fault,
        ratio,
    };
    vec![
        (
            "chat cut off",
            s(
                "/chat/completions",
                &chat(json!({"include_usage": true})),
                "",
                300,
                90,
                None,
                1000,
            ),
        ),
        (
            "chat completed",
            s(
                "/chat/completions",
                &chat(json!({"include_usage": false})),
                "",
                60,
                100_000,
                None,
                1000,
            ),
        ),
        (
            "chat without usage",
            s(
                "/chat/completions",
                &chat(json!({"include_usage": true})),
                "",
                60,
                100_000,
                Some(Fault::MissingUsage),
                1000,
            ),
        ),
        (
            "responses cut off",
            s("/responses", &responses, "", 300, 90, None, 1000),
        ),
        (
            "responses completed",
            s("/responses", &responses, "", 60, 100_000, None, 1000),
        ),
        (
            "messages cut off at 1000",
            s("/messages", &messages, "", 300, 120, None, 1000),
        ),
        (
            "messages cut off at 1500",
            s("/messages", &messages, "", 300, 120, None, 1500),
        ),
        (
            "messages dropped at 1500",
            s("/messages", &messages, "drop=1", 300, 100_000, None, 1500),
        ),
        (
            "messages completed at 1500",
            s("/messages", &messages, "", 60, 100_000, None, 1500),
        ),
    ]
}

async fn compare(store: Store) {
    compare_some(store, |_| true).await;
}

async fn compare_some(store: Store, which: impl Fn(&str) -> bool) {
    for (name, s) in scenarios().into_iter().filter(|(n, _)| which(n)) {
        let (exact_events, exact_used) = stream(&s, "exact", store).await;
        let (bound_events, bound_used) = stream(&s, "bound", store).await;
        assert_eq!(bound_events, exact_events, "{name} ({store:?}): events");
        // The input at least: 0 would mean the store never saw the stream.
        assert!(
            exact_used > 0,
            "{name} ({store:?}): nothing settled in the store"
        );
        assert_eq!(bound_used, exact_used, "{name} ({store:?}): tokens settled");
        if name.contains("cut off") {
            assert!(
                ["\"length\"", "response.incomplete", "max_tokens"]
                    .iter()
                    .any(|m| exact_events.contains(m)),
                "{name}: the quota cut the stream off: {exact_events}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_first_and_exact_relays_agree_on_the_memory_store() {
    compare(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_first_and_exact_relays_agree_on_redis() {
    compare(Store::Redis).await;
}

/// Store replies slower than `store.timeout_ms`'s default (50 ms), as on a
/// loaded machine: the streams are still decided, extended and settled in
/// Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_first_and_exact_relays_agree_on_a_slow_redis() {
    compare_some(Store::SlowRedis, |name| name == "chat cut off").await;
}
