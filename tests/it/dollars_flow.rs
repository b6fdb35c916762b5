//! Dollar budgets over a request's life (docs/MONEY.md): cache reads and
//! 5-minute / 1-hour cache writes priced apart (and the reservation at the
//! write price when the body asks for caching), a price reload between
//! reserve and settle that must not re-price the request, and a stream
//! cut off by a dollar extension — charged what was delivered, its last
//! grant partial and exact. Faults guarded against: cache tokens priced as
//! plain input, a settlement reading the prices of the policy in force at
//! settle time, an extension step debiting tokens from a dollar budget.

use std::time::Duration;

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::config::estimate::{Encoding, EstimateSettings};
use budgetgate::config::reload::{reload, ReloadOutcome, Trigger};
use budgetgate::dialects::Dialect;
use budgetgate::estimate::{estimate, ModelEstimation};
use serde_json::{json, Value};

use super::dollars::{cost, priced, IN, OUT};
use crate::support::mock_upstream::MockUpstream;
use crate::support::*;

/// Claude Sonnet 4.5's prices, µ$ per million: input, cache read, 5-minute
/// write, 1-hour write, output.
const SONNET: [u64; 5] = [3_000_000, 300_000, 3_750_000, 6_000_000, 15_000_000];

/// An Anthropic upstream serving `claude-test` at Sonnet's prices, tenant
/// `tenant` with $10 a day.
pub fn claude_config(mock: &MockUpstream, tenant: &str) -> TestConfig {
    let mut c = TestConfig::new();
    c.upstreams.push(config::RawUpstream {
        api_key_env: Some("CARGO_PKG_NAME".into()),
        forward_client_headers: vec!["x-mock-messages".into()],
        ..config::upstream("claude0", Kind::Anthropic, &mock.root_url())
    });
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        max_output_tokens: Some(64000),
        token_ratio: Some(1000),
        price: Some(RawPrice {
            cached_input: Some("0.30".into()),
            cache_write_5m: Some("3.75".into()),
            cache_write_1h: Some("6".into()),
            ..price("3", "15")
        }),
        ..config::model("claude-test", &["claude0"])
    });
    c.tenants.push(config::tenant(
        tenant,
        "k1",
        KEY,
        limits().usd_per_day("10"),
    ));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_reads_and_writes_are_priced_at_their_prices_to_the_micro_dollar() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(40);
    let tenant = "payer-cache";
    let gw = claude_config(&mock, tenant).start().await;
    let body = json!({
        "model": "claude-test", "max_tokens": 100,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [{"role": "user", "content": "hi"}],
    });
    let scope = Scope::Tenant(tenant.into());

    // While the upstream holds the answer, the reservation is the input
    // at the 1-hour write price (the body asks for a 1-hour cache) plus
    // the cap at the output price.
    mock.state.hold();
    let send = {
        let (url, body) = (format!("{}/messages", gw.base_url()), body.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .header("x-api-key", KEY)
                .header("anthropic-version", "2023-06-01")
                .header("x-mock-messages", "cache_read=10000,cache_creation=2000")
                .json(&body)
                .send()
                .await
                .expect("POST /v1/messages")
        })
    };
    wait_held(&mock).await;
    let me = ModelEstimation {
        encoding: Encoding::O200kBase,
        default_max_output_tokens: 256,
        max_output_tokens: Some(64000),
        min_output_tokens: 16,
        token_ratio: 1000,
        image: budgetgate::config::estimate::ImageCost::flat(1536),
    };
    let input = estimate(
        Dialect::Messages,
        &body,
        &me,
        &EstimateSettings::default(),
        budgetgate::estimate::TokenRoom::default(),
    )
    .unwrap()
    .input_tokens;
    let reserved = (input * SONNET[3] + 100 * SONNET[4]).div_ceil(1_000_000);
    assert_eq!(
        gw.used(scope.clone(), BudgetName::UsdPerDay).await,
        reserved
    );
    mock.state.release();

    let r = send.await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let u = &v["usage"];
    let n = |k: &str| u[k].as_u64().unwrap_or_else(|| panic!("no usage.{k}: {v}"));
    let (uncached, read, written, out) = (
        n("input_tokens"),
        n("cache_read_input_tokens"),
        n("cache_creation_input_tokens"),
        n("output_tokens"),
    );
    let one_hour = u["cache_creation"]["ephemeral_1h_input_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!((read, written, one_hour, out), (10_000, 2000, 500, 40));
    gw.settled().await;
    let want = (uncached * SONNET[0]
        + read * SONNET[1]
        + (written - one_hour) * SONNET[2]
        + one_hour * SONNET[3]
        + out * SONNET[4])
        .div_ceil(1_000_000);
    assert_eq!(gw.used(scope, BudgetName::UsdPerDay).await, want);
}

async fn wait_held(mock: &MockUpstream) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while mock.state.held_count() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_price_reload_between_reserve_and_settle_does_not_reprice_the_request() {
    let mock = start_mock().await;
    let tenant = "payer-reload";
    let cfg = priced(&mock.base_url(), tenant, limits().usd_per_day("5"));
    let gw = cfg.start().await;
    let scope = Scope::Tenant(tenant.into());

    mock.state.hold();
    let send = {
        let url = format!("{}/chat/completions", gw.base_url());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(KEY)
                .json(&hi(30))
                .send()
                .await
                .expect("POST")
        })
    };
    wait_held(&mock).await;
    // Ten times the price, applied while the request waits for its answer.
    let mut dearer = cfg.clone();
    dearer.model("gpt-4o-mini").price = Some(price("1.50", "6.00"));
    let dir = tempfile::tempdir().unwrap();
    let path = dearer.write(dir.path());
    assert!(matches!(
        reload(&gw.state.policy, &path, Trigger::Signal),
        ReloadOutcome::Applied { .. }
    ));
    mock.state.release();
    let r = send.await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let (p, o) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    gw.settled().await;
    let first = cost(p, o);
    assert_eq!(
        gw.used(scope.clone(), BudgetName::UsdPerDay).await,
        first,
        "priced at the prices it was admitted under"
    );

    // The next request is priced at the new prices.
    let r = post_chat(&gw, KEY, &hi(30)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let (p, o) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    gw.settled().await;
    let second = (p * IN * 10 + o * OUT * 10).div_ceil(1_000_000);
    assert_eq!(gw.used(scope, BudgetName::UsdPerDay).await, first + second);
}

/// The largest `g ≤ step` a budget with `rem` µ$ left pays for at `rate`
/// µ$ per million tokens, by the definition.
fn payable(step: u64, rate: u64, rem: u64) -> u64 {
    (0..=step)
        .rev()
        .find(|g| (g * rate).div_ceil(1_000_000) <= rem)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_off_by_its_dollar_budget_is_charged_what_was_delivered() {
    stream_cut_off_by_dollars(None).await;
}

/// The same on Redis: the partial grant computed by `lua/extend.lua`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_stream_cut_off_by_its_dollar_budget_is_charged_what_was_delivered() {
    let url = crate::support::redis_server::shared().url();
    stream_cut_off_by_dollars(Some(&url)).await;
}

async fn stream_cut_off_by_dollars(redis: Option<&str>) {
    let mock = start_mock().await;
    mock.state.set_output_tokens(4000);
    let tenant = "payer-stream";
    // One tenth of a cent: a few extension steps of 256 tokens at $0.60
    // per million (154 µ$ each), then a partial one.
    let mut cfg = priced(&mock.base_url(), tenant, limits().usd_per_day("0.001"));
    if let Some(url) = redis {
        cfg = cfg.redis(url);
        cfg.store.key_prefix = Some(format!("bgstream{}", uuid::Uuid::new_v4().simple()));
    }
    let gw = cfg.start().await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Tell me a long story."}], "stream": true});
    let input = chat_input_tokens(&body);

    // What the store must grant: the reservation (16 output tokens), then
    // 256-token steps while they fit, then the largest partial step.
    let mut rem = 1000 - cost(input, 16);
    let (mut reserved, mut steps, mut partial) = (16u64, 0, 0);
    loop {
        let g = payable(256, OUT, rem);
        if g == 0 {
            break;
        }
        rem -= (g * OUT).div_ceil(1_000_000);
        reserved += g;
        if g == 256 {
            steps += 1;
        } else {
            partial = g;
        }
    }
    assert!(
        steps >= 3 && partial > 0 && partial < 256,
        "{steps} steps, partial {partial}"
    );

    let r = post_chat(&gw, KEY, &body).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let chunks = sse_chunks(&text);
    assert_eq!(
        content_chunks(&chunks) as u64,
        reserved,
        "delivered what was granted"
    );
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "length"),
        "ends as a length-capped answer"
    );
    assert_eq!(sse_data(&text).last().map(String::as_str), Some("[DONE]"));
    // The relay settles after its last frame: wait for the refund.
    let scope = Scope::Tenant(tenant.into());
    let want = cost(input, reserved);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut spent = gw.used(scope.clone(), BudgetName::UsdPerDay).await;
    while spent != want && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        spent = gw.used(scope.clone(), BudgetName::UsdPerDay).await;
    }
    gw.settled().await;
    assert_eq!(
        spent, want,
        "the prompt and the delivered output at their prices"
    );
    assert_eq!(
        gw.used(scope, BudgetName::UsdPerDay).await,
        want,
        "settled once"
    );
}

/// A client that goes away while its answer is awaited: the reservation
/// is dropped unsettled and its backstop charges the reservation in full
/// — in µ$ on the dollar budget (not its token count read as µ$).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_reservation_charges_its_dollars_in_full() {
    let mock = start_mock().await;
    let tenant = "payer-dropped";
    let gw = priced(&mock.base_url(), tenant, limits().usd_per_day("5"))
        .start()
        .await;
    mock.state.hold();
    let url = format!("{}/chat/completions", gw.base_url());
    let client = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .bearer_auth(KEY)
            .json(&hi(300))
            .send()
            .await
    });
    // Admitted and sent upstream; then the client goes away.
    wait_held(&mock).await;
    client.abort();
    let want = cost(chat_input_tokens(&hi(300)), 300);
    let scope = Scope::Tenant(tenant.into());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gw.memory().live_holds() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the dropped reservation never settled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gw.settled().await;
    mock.state.release();
    assert_eq!(gw.used(scope, BudgetName::UsdPerDay).await, want);
}
