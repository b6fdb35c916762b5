//! Requests without an output cap run to their natural end, streamed or
//! not (DESIGN section 5, "Uncapped requests"): they go upstream without
//! a cap, reserve what `output_reservation` says, and settle the rest as
//! debt within `max_exposure`, past which a request reserves the model's
//! maximum; a `self_hosted` server's context is never overrun by a cap
//! the gateway invented.

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::config::output_reservation::RawMaxExposure;
use serde_json::{json, Value};

use crate::support::mock_upstream::MockUpstream;
use crate::support::*;

/// The standard gateway (`gpt-4o-mini` on a self-hosted deployment,
/// default output 256, at most 4096) with tenant `t1` in `mode` and
/// `reasoning` set on the model.
fn responses_config(mock: &MockUpstream, mode: &str, reasoning: bool) -> TestConfig {
    let mut c = TestConfig::standard(
        &mock.base_url(),
        256,
        limits().tpm(1_000_000).tokens_per_day(1_000_000),
    );
    c.model("gpt-4o-mini").reasoning = Some(reasoning);
    c.tenant("t1").output_reservation = Some(mode.to_string());
    c
}

async fn post(gw: &Gateway, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", gw.base_url()))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .expect("request")
}

/// The data of a Responses stream's events, by name.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|frame| {
            let mut name = None;
            let mut data = None;
            for line in frame.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).ok();
                }
            }
            Some((name?, data?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncapped_responses_answer_of_2000_tokens_completes_in_both_modes_reasoning_or_not() {
    for mode in ["cap", "expected"] {
        for reasoning in [false, true] {
            let mock = start_mock().await;
            mock.state.set_output_tokens(2000);
            mock.state
                .set_responses_details(0, if reasoning { 500 } else { 0 });
            let gw = responses_config(&mock, mode, reasoning).start().await;
            let case = format!("{mode}, reasoning {reasoning}");
            let body = json!({"model": "gpt-4o-mini", "input": "Write a long story."});
            let r = post(&gw, "/responses", &body).await;
            assert_eq!(r.status(), 200, "{case}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(
                v["status"], "completed",
                "{case}: {}",
                v["incomplete_details"]
            );
            let output = if reasoning { 2500 } else { 2000 };
            assert_eq!(v["usage"]["output_tokens"], output, "{case}");
            let sent = mock.state.requests();
            assert!(
                sent[0].body.get("max_output_tokens").is_none(),
                "{case}: forwarded uncapped: {}",
                sent[0].body
            );
            // Streamed: a reasoning stream is not metered either, and is
            // forwarded alike.
            let mut streamed = body.clone();
            streamed["stream"] = json!(true);
            let r = post(&gw, "/responses", &streamed).await;
            assert_eq!(r.status(), 200, "{case}");
            let evs = events(&r.text().await.unwrap());
            let (name, last) = evs.last().expect("a terminal event");
            assert_eq!(name, "response.completed", "{case}: {last}");
            assert_eq!(last["response"]["usage"]["output_tokens"], output, "{case}");
            gw.all_settled().await;
            let total = v["usage"]["total_tokens"].as_u64().unwrap()
                + last["response"]["usage"]["total_tokens"].as_u64().unwrap();
            assert_eq!(
                gw.t1_used(BudgetName::TokensPerDay).await,
                total,
                "{case}: what was answered is charged in full"
            );
            assert_eq!(gw.memory().live_holds(), 0, "{case}");
            assert_eq!(
                gw.state
                    .expected
                    .exposure
                    .in_use(&gw.budgets(Scope::Tenant("t1".into()))[0].key),
                0,
                "{case}: exposure given back"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncapped_request_reserves_the_default_and_takes_the_rest_as_exposure() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let mut c = responses_config(&mock, "cap", false);
    // One request's exposure (4096 − 256) fits, two do not.
    c.tenant("t1").max_exposure = Some(RawMaxExposure::Tokens(5000));
    let gw = c.start().await;
    let t1 = Scope::Tenant("t1".into());
    mock.state.hold();
    let url = gw.base_url();
    let send = |url: String| async move {
        reqwest::Client::new()
            .post(format!("{url}/chat/completions"))
            .bearer_auth(KEY)
            .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("request")
            .status()
    };
    let a = tokio::spawn(send(url.clone()));
    wait_held(&mock, 1).await;
    let one = gw.used(t1.clone(), BudgetName::TokensPerDay).await;
    let b = tokio::spawn(send(url));
    wait_held(&mock, 2).await;
    let two = gw.used(t1.clone(), BudgetName::TokensPerDay).await;
    assert!(
        (256..300).contains(&one),
        "the first reserves the default output: {one}"
    );
    assert!(
        two - one >= 4096,
        "the second, past max_exposure, reserves the model's maximum: {}",
        two - one
    );
    mock.state.release();
    assert_eq!(a.await.unwrap(), 200);
    assert_eq!(b.await.unwrap(), 200);
    gw.all_settled().await;
    assert_eq!(gw.state.expected.exposure.in_use(&gw.budgets(t1)[0].key), 0);
}

async fn wait_held(mock: &MockUpstream, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while mock.state.held_count() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} requests never reached the upstream"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncapped_request_with_a_6000_token_prompt_fits_an_8192_token_self_hosted_context() {
    let mock = start_mock().await;
    mock.state.set_context_window(8192);
    mock.state.set_output_tokens(1500);
    let mut c = TestConfig::standard(&mock.base_url(), 1024, limits().tpm(1_000_000));
    c.model("gpt-4o-mini").context_window = Some(8192);
    let gw = c.start().await;
    // Every word is one token: 5,990 of them and the framing make ~6,000.
    let prompt = " the".repeat(5990);
    for stream in [false, true] {
        let body = json!({
            "model": "gpt-4o-mini", "stream": stream,
            "messages": [{"role": "user", "content": prompt}],
        });
        let r = post_chat(&gw, KEY, &body).await;
        assert_eq!(r.status(), 200, "stream {stream}");
        let text = r.text().await.unwrap();
        let (finish, tokens) = if stream {
            let chunks = sse_chunks(&text);
            let finish = chunks.iter().find_map(|c| {
                c["choices"][0]["finish_reason"]
                    .as_str()
                    .map(str::to_string)
            });
            (finish.unwrap_or_default(), content_chunks(&chunks) as u64)
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            (
                v["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                v["usage"]["completion_tokens"].as_u64().unwrap(),
            )
        };
        assert_eq!(finish, "stop", "stream {stream}: its natural end");
        assert_eq!(tokens, 1500, "stream {stream}");
    }
    for sent in mock.state.requests() {
        assert_eq!(
            (
                sent.body.get("max_tokens"),
                sent.body.get("max_completion_tokens")
            ),
            (None, None),
            "forwarded uncapped: {}",
            sent.body
        );
    }
    gw.all_settled().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_uncapped_requests_spend_at_most_the_quota_plus_max_exposure() {
    const QUOTA: u64 = 200_000;
    const MAX_EXPOSURE: u64 = 100_000;
    const MAX_OUTPUT: u64 = 32_000;
    let mock = start_mock().await;
    // Every answer runs to the model's maximum: the worst case.
    mock.state.set_output_tokens(MAX_OUTPUT);
    let mut c = TestConfig::standard(&mock.base_url(), 1024, limits().tokens_per_day(QUOTA));
    c.model("gpt-4o-mini").max_output_tokens = Some(MAX_OUTPUT as i64);
    c.tenant("t1").max_exposure = Some(RawMaxExposure::Tokens(MAX_EXPOSURE as i64));
    let gw = c.start().await;
    mock.state.hold();
    let mut requests = Vec::new();
    for _ in 0..50 {
        let url = gw.base_url();
        requests.push(tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{url}/chat/completions"))
                .bearer_auth(KEY)
                .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Write at length."}]}))
                .send()
                .await
                .expect("request");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or_default())
        }));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while requests.iter().filter(|t| t.is_finished()).count() + mock.state.held_count() < 50 {
        assert!(
            std::time::Instant::now() < deadline,
            "requests neither admitted nor refused"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let admitted = mock.state.held_count();
    let held = gw.t1_used(BudgetName::TokensPerDay).await;
    assert!(held <= QUOTA, "reservations within the quota: {held}");
    mock.state.release();
    let mut ok = 0;
    for r in requests {
        let (status, v) = r.await.unwrap();
        assert!(status == 200 || status == 429, "{status}: {v}");
        if status == 200 {
            ok += 1;
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{}", v["usage"]);
            assert_eq!(v["usage"]["completion_tokens"], MAX_OUTPUT);
        }
    }
    gw.all_settled().await;
    let spent = gw.t1_used(BudgetName::TokensPerDay).await;
    println!("{ok} of 50 admitted ({admitted} at once), spent {spent}");
    assert_eq!(ok, admitted);
    assert!(ok > 0, "some are admitted");
    assert!(
        spent <= QUOTA + MAX_EXPOSURE,
        "spent {spent} > quota + max_exposure (fleet of one)"
    );
}
