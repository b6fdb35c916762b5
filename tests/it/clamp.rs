//! Affordable caps instead of refusals: a tenant with
//! `on_short_output = "clamp"` gets a cap that does not fit its budgets
//! lowered to what fits, sent upstream in the dialect's cap field and
//! reported in `x-budgetgate-output-clamped`; without it the request is
//! refused as before. Both stores: the room comes from the store's refusal.

use serde_json::{json, Value};

use crate::support::redis_server::RedisServer;
use crate::support::*;

const CLAMPED: &str = "x-budgetgate-output-clamped";

fn chat(max_tokens: u64, stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": "hi"}]})
}

/// Room for 1,000 output tokens (an `output_tpm` of 1,000), clamping or
/// not; a chat stream reserves its client's whole cap at once (the default
/// `client_cap_reservation = "full"`).
fn config(mock: &str, clamp: bool) -> TestConfig {
    let mut c = TestConfig::standard(mock, 50, limits().output_tpm(1000));
    if clamp {
        c.tenant("t1").on_short_output = Some("clamp".into());
    }
    c
}

/// 4,000 asked, 1,000 of room: admitted at 1,000 (upstream body, header);
/// then, with part of the room spent, a stream gets what is left and ends
/// at that cap with `length`. Without `clamp`: refused, nothing sent.
async fn clamps_or_refuses(redis: Option<&str>) {
    let mock = start_mock().await;
    let with_store = |c: TestConfig| match redis {
        Some(url) => c.redis(url),
        None => c,
    };
    mock.state.set_output_tokens(300);
    let gw = with_store(config(&mock.base_url(), true)).start().await;
    let r = post_chat(&gw, KEY, &chat(4000, false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, CLAMPED).as_deref(), Some("1000"));
    let _ = r.text().await;
    assert_eq!(mock.state.requests()[0].body["max_completion_tokens"], 1000);
    if redis.is_none() {
        gw.all_settled().await;
    } else {
        // The harness tracks settlements of its own memory store only.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }

    // 300 spent: about 700 left (plus what refilled since).
    mock.state.set_output_tokens(2000);
    let r = post_chat(&gw, KEY, &chat(4000, true)).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let cap: u64 = header(&r, CLAMPED).unwrap().parse().unwrap();
    assert!((700..800).contains(&cap), "{cap}");
    let chunks = sse_chunks(&r.bytes().await.unwrap());
    assert_eq!(
        mock.state.requests()[1].body["max_completion_tokens"],
        json!(cap)
    );
    let finish: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/finish_reason"))
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&json!("length")], "{chunks:?}");
    drop(gw);

    let refusing = with_store(config(&mock.base_url(), false)).start().await;
    let sent = mock.state.requests().len();
    let r = post_chat(&refusing, KEY, &chat(4000, false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, CLAMPED), None);
    assert_eq!(mock.state.requests().len(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clamping_tenant_gets_the_cap_that_fits_memory_store() {
    clamps_or_refuses(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clamping_tenant_gets_the_cap_that_fits_redis_store() {
    let redis = RedisServer::start();
    clamps_or_refuses(Some(&redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_inherits_clamp_and_may_override_it() {
    let mock = start_mock().await;
    let mut c = config(&mock.base_url(), true);
    let mut child = config::tenant("t2", "k2", "sk-child", limits());
    child.parent = Some("t1".into());
    c.tenants.push(child);
    let mut refusing = config::tenant("t3", "k3", "sk-refusing", limits());
    refusing.parent = Some("t1".into());
    refusing.on_short_output = Some("refuse".into());
    c.tenants.push(refusing);
    let gw = c.start().await;
    let r = post_chat(&gw, "sk-child", &chat(4000, false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, CLAMPED).as_deref(), Some("1000"));
    let r = post_chat(&gw, "sk-refusing", &chat(4000, false)).await;
    assert_eq!(r.status(), 429);
}
