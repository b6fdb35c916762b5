//! The OpenAI Responses API (`/v1/responses`) through the gateway and the
//! simulated upstream: settlement from terminal events, the cutoff's
//! `response.incomplete`, incomplete/failed/dropped streams, stored
//! responses kept to their tenant and deployment, refusals, the
//! `input_tokens` route, the cap and usage fields sent upstream, and
//! per-kind upstream URLs and config checks.

use budgetgate::budget::BudgetName;
use budgetgate::config::Policy;
use serde_json::{json, Value};

use crate::support::config::{model, tenant, upstream, RawModel, RawUpstream as Upstream};
use crate::support::mock_upstream::{self, Fault, MockUpstream};
use crate::support::*;

const KEY2: &str = "sk-test-other-tenant";

/// One upstream, model gpt-4o-mini (default output `default_out`), tenant
/// t1 with `limits` plus a daily quota to read charges from, tenant t2.
fn cfg(mock: &MockUpstream, default_out: u64, limits: Limits) -> TestConfig {
    let limits = limits.tokens_per_day(1_000_000).requests_per_day(1000);
    TestConfig::standard(&mock.base_url(), default_out, limits).with_tenant(tenant(
        "t2",
        "k2",
        KEY2,
        crate::support::limits().tpm(1_000_000),
    ))
}

/// Used amount of t1's `name` budget.
async fn used(gw: &Gateway, name: BudgetName) -> u64 {
    gw.t1_used(name).await
}

async fn tokens_used(gw: &Gateway) -> u64 {
    used(gw, BudgetName::TokensPerDay).await
}

async fn post(gw: &Gateway, key: &str, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", gw.base_url()))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("request")
}

async fn call(gw: &Gateway, key: &str, method: reqwest::Method, path: &str) -> reqwest::Response {
    reqwest::Client::new()
        .request(method, format!("{}{path}", gw.base_url()))
        .bearer_auth(key)
        .send()
        .await
        .expect("request")
}

/// The events of an SSE body: (event name, data).
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let mut name = String::new();
            let mut data = String::new();
            for line in f.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    name = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            (name, serde_json::from_str(&data).unwrap_or(Value::Null))
        })
        .collect()
}

fn text_deltas(evs: &[(String, Value)]) -> u64 {
    evs.iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .count() as u64
}

async fn stream_events(gw: &Gateway, body: &Value) -> Vec<(String, Value)> {
    let r = post(gw, KEY, "/responses", body).await;
    assert_eq!(r.status(), 200);
    events(&r.text().await.expect("stream body"))
}

fn last_upstream_body(mock: &MockUpstream) -> Value {
    mock.state
        .requests()
        .last()
        .expect("an upstream request")
        .body
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_and_streamed_responses_settle_the_terminal_usage_with_a_cap_and_no_include_usage() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let gw = cfg(&mock, 100, limits()).start().await;
    let body = json!({"model": "gpt-4o-mini", "instructions": "Be brief.", "input": "Say hello to the world."});

    let r = post(&gw, KEY, "/responses", &body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "completed");
    let total = v["usage"]["total_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["output_tokens"], 10);
    gw.settled().await;
    assert_eq!(
        tokens_used(&gw).await,
        total,
        "settled the body's usage exactly"
    );
    let up = last_upstream_body(&mock);
    assert!(
        up.get("max_output_tokens").is_none(),
        "uncapped, on a model with a bound: no cap goes upstream"
    );
    assert!(up.get("stream_options").is_none());

    // Streamed: the completed event's usage settles; the upstream body has
    // no cap (as the client's) and no include_usage (the API would refuse it).
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let evs = stream_events(&gw, &sbody).await;
    let (name, last) = evs.last().unwrap();
    assert_eq!(name, "response.completed");
    assert_eq!(text_deltas(&evs), 10);
    let stotal = last["response"]["usage"]["total_tokens"].as_u64().unwrap();
    gw.settled().await;
    assert_eq!(tokens_used(&gw).await, total + stotal);
    let up = last_upstream_body(&mock);
    assert!(up.get("max_output_tokens").is_none(), "{up}");
    assert!(
        up.pointer("/stream_options/include_usage").is_none(),
        "{up}"
    );

    // Cached and reasoning subsets are never added twice.
    mock.state.set_responses_details(5, 7);
    let r = post(&gw, KEY, "/responses", &body).await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["output_tokens"], 17);
    let t3 = v["usage"]["total_tokens"].as_u64().unwrap();
    gw.settled().await;
    assert_eq!(tokens_used(&gw).await, total + stotal + t3);
    assert_eq!(gw.memory().live_holds(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cap_below_16_is_refused_and_a_small_default_goes_up_as_16() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(40);
    let mut c = cfg(&mock, 16, limits());
    // No bound known: an uncapped request is sent its reservation as the cap.
    c.model("gpt-4o-mini").max_output_tokens = None;
    let gw = c.start().await;
    let r = post(
        &gw,
        KEY,
        "/responses",
        &json!({"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": 8}),
    )
    .await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "max_output_tokens");
    assert_eq!(mock.state.request_count(), 0);
    let r = post(
        &gw,
        KEY,
        "/responses",
        &json!({"model": "gpt-4o-mini", "input": "hi"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(last_upstream_body(&mock)["max_output_tokens"], 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_cutoff_ends_with_response_incomplete_and_charges_prompt_plus_delivered() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(2000);
    let gw = cfg(&mock, 50, limits().tpm(400)).start().await;
    let body = json!({"model": "gpt-4o-mini", "input": "Write a long story.", "stream": true});
    let evs = stream_events(&gw, &body).await;
    let (name, last) = evs.last().unwrap();
    assert_eq!(name, "response.incomplete", "ends with the cutoff event");
    assert!(!evs.iter().any(|(n, _)| n == "response.completed"));
    let created = &evs[0].1["response"];
    let resp = &last["response"];
    assert_eq!(resp["id"], created["id"]);
    assert_eq!(resp["created_at"], created["created_at"]);
    assert_eq!(resp["model"], created["model"]);
    assert_eq!(resp["status"], "incomplete");
    assert_eq!(resp["incomplete_details"]["reason"], "max_output_tokens");
    let before = evs[evs.len() - 2].1["sequence_number"].as_u64().unwrap();
    assert_eq!(last["sequence_number"].as_u64().unwrap(), before + 1);
    let delivered = text_deltas(&evs);
    assert!(delivered > 50 && delivered < 400, "delivered {delivered}");
    assert_eq!(resp["usage"]["output_tokens"].as_u64().unwrap(), delivered);
    let text: String = evs
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        resp["output"][0]["content"][0]["text"].as_str().unwrap(),
        text
    );
    let input = resp["usage"]["input_tokens"].as_u64().unwrap();
    gw.settled().await;
    assert_eq!(
        tokens_used(&gw).await,
        input + delivered,
        "prompt + delivered output"
    );
    assert_eq!(gw.memory().live_holds(), 0);
}

async fn settle_of(fault: Fault) -> (Vec<(String, Value)>, u64, u64) {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20);
    mock.state.set_fault(Some(fault));
    let gw = cfg(&mock, 100, limits()).start().await;
    let body = json!({"model": "gpt-4o-mini", "input": "Say something.", "stream": true});
    let input = {
        let r = post(
            &gw,
            KEY,
            "/responses/input_tokens",
            &json!({"model": "gpt-4o-mini", "input": "Say something."}),
        )
        .await;
        r.json::<Value>().await.unwrap()["input_tokens"]
            .as_u64()
            .unwrap()
    };
    let evs = stream_events(&gw, &body).await;
    gw.settled().await;
    assert_eq!(gw.memory().live_holds(), 0);
    (evs, tokens_used(&gw).await, input)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_failed_and_dropped_streams_settle_the_documented_amounts() {
    // Upstream cap: response.incomplete with usage settles that usage.
    let (evs, charged, _) = settle_of(Fault::ResponseIncomplete).await;
    let (name, last) = evs.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(
        charged,
        last["response"]["usage"]["total_tokens"].as_u64().unwrap()
    );

    // response.failed with usage: that usage.
    let (evs, charged, _) = settle_of(Fault::ResponseFailed).await;
    let (name, last) = evs.last().unwrap();
    assert_eq!(name, "response.failed");
    assert_eq!(
        charged,
        last["response"]["usage"]["total_tokens"].as_u64().unwrap()
    );

    // response.failed without usage: the input estimate + delivered output
    // (never zero, never the whole reservation).
    let (evs, charged, input) = settle_of(Fault::ResponseFailedNoUsage).await;
    assert_eq!(evs.last().unwrap().0, "response.failed");
    assert_eq!(charged, input + text_deltas(&evs));
    assert_eq!(text_deltas(&evs), 10);

    // Dropped connection: an `error` event with an error object; input + delivered.
    let (evs, charged, input) = settle_of(Fault::DropMidStream).await;
    let (name, last) = evs.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(last["type"], "error");
    assert!(last["error"]["message"].is_string() && last["error"]["code"].is_string());
    assert!(last["sequence_number"].is_u64());
    assert_eq!(text_deltas(&evs), 3);
    assert_eq!(charged, input + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_belong_to_their_tenant() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let gw = cfg(&mock, 100, limits()).start().await;
    let r = post(
        &gw,
        KEY,
        "/responses",
        &json!({"model": "gpt-4o-mini", "input": "Remember the number 7."}),
    )
    .await;
    let first: Value = r.json().await.unwrap();
    let id = first["id"].as_str().unwrap().to_string();
    let context = first["usage"]["total_tokens"].as_u64().unwrap();
    gw.settled().await;
    let n = mock.state.request_count();

    // Another tenant: 404 on every route, no upstream request.
    use reqwest::Method;
    for (m, p) in [
        (Method::GET, format!("/responses/{id}")),
        (Method::DELETE, format!("/responses/{id}")),
        (Method::POST, format!("/responses/{id}/cancel")),
        (Method::GET, format!("/responses/{id}/input_items")),
    ] {
        let r = call(&gw, KEY2, m.clone(), &p).await;
        assert_eq!(r.status(), 404, "{m} {p}");
    }
    let follow =
        json!({"model": "gpt-4o-mini", "input": "Which number?", "previous_response_id": id});
    let r = post(&gw, KEY2, "/responses", &follow).await;
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["param"], "previous_response_id");
    let r = post(&gw, KEY2, "/responses/input_tokens", &follow).await;
    assert_eq!(r.status(), 404, "the estimate route keeps it too");
    // Unknown and malformed ids: 404 by default.
    for bad in ["resp_unknown", "resp.../x", ""] {
        let mut b = follow.clone();
        b["previous_response_id"] = json!(bad);
        assert_eq!(
            post(&gw, KEY, "/responses", &b).await.status(),
            404,
            "{bad:?}"
        );
    }
    assert_eq!(
        call(&gw, KEY, Method::GET, "/responses/resp_unknown")
            .await
            .status(),
        404
    );
    assert_eq!(
        mock.state.request_count(),
        n,
        "no upstream request for any of them"
    );

    // The owner: GET and input_items proxied; request budgets charged, token budgets not.
    let tokens = tokens_used(&gw).await;
    let requests = used(&gw, BudgetName::RequestsPerDay).await;
    let r = call(&gw, KEY, Method::GET, &format!("/responses/{id}")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["id"], id);
    let r = call(
        &gw,
        KEY,
        Method::GET,
        &format!("/responses/{id}/input_items?limit=5"),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        mock.state.requests().last().unwrap().query.as_deref(),
        Some("limit=5")
    );
    gw.settled().await;
    assert_eq!(tokens_used(&gw).await, tokens);
    assert_eq!(used(&gw, BudgetName::RequestsPerDay).await, requests + 2);

    // The follow-up is estimated as the recorded context + the new input.
    let r = post(&gw, KEY, "/responses/input_tokens", &follow).await;
    let with_context = r.json::<Value>().await.unwrap()["input_tokens"]
        .as_u64()
        .unwrap();
    let mut alone = follow.clone();
    alone
        .as_object_mut()
        .unwrap()
        .remove("previous_response_id");
    let r = post(&gw, KEY, "/responses/input_tokens", &alone).await;
    let new_input = r.json::<Value>().await.unwrap()["input_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(with_context, context + new_input);
    let r = post(&gw, KEY, "/responses", &follow).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["usage"]["input_tokens"].as_u64().unwrap(),
        with_context,
        "the mock counts the same context"
    );

    // DELETE by the owner deletes the record: then unknown, without an upstream call.
    assert_eq!(
        call(&gw, KEY, Method::DELETE, &format!("/responses/{id}"))
            .await
            .status(),
        200
    );
    let n = mock.state.request_count();
    assert_eq!(
        call(&gw, KEY, Method::GET, &format!("/responses/{id}"))
            .await
            .status(),
        404
    );
    assert_eq!(mock.state.request_count(), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_can_fetch_a_response_while_it_streams() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(30);
    mock.state
        .set_token_delay(std::time::Duration::from_millis(30));
    let gw = cfg(&mock, 100, limits()).start().await;
    let mut r = post(
        &gw,
        KEY,
        "/responses",
        &json!({"model": "gpt-4o-mini", "input": "Count.", "stream": true}),
    )
    .await;
    let mut buf = String::new();
    let id = loop {
        let chunk = r.chunk().await.unwrap().expect("stream ended early");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        if let Some((_, v)) = events(&buf)
            .into_iter()
            .find(|(n, _)| n == "response.created")
        {
            break v["response"]["id"].as_str().unwrap().to_string();
        }
    };
    let g = call(&gw, KEY, reqwest::Method::GET, &format!("/responses/{id}")).await;
    assert_eq!(g.status(), 200);
    assert_eq!(g.json::<Value>().await.unwrap()["status"], "in_progress");
    assert_eq!(
        call(&gw, KEY2, reqwest::Method::GET, &format!("/responses/{id}"))
            .await
            .status(),
        404
    );
    while r.chunk().await.unwrap().is_some() {}
}

/// Two deployments, least-utilised routing: a follow-up goes to the
/// deployment that holds the response even when the other has more room,
/// and a refusal there is a 429, never the other deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_goes_only_to_the_recorded_deployment() {
    let a = start_mock().await;
    let b = start_mock().await;
    for m in [&a, &b] {
        m.state.set_output_tokens(10);
    }
    let mut c = TestConfig::new();
    c.upstreams.push(Upstream {
        limits: limits().tpm(1_000_000),
        ..upstream("a", Kind::Openai, &a.base_url())
    });
    c.upstreams.push(Upstream {
        limits: limits().tpm(400),
        ..upstream("b", Kind::Openai, &b.base_url())
    });
    c.models.push(RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(50),
        max_output_tokens: Some(4096),
        routing: Some("priority".into()),
        ..model("gpt-4o-mini", &["b", "a"])
    });
    let c = c.with_tenant(tenant("t1", "k1", KEY, limits().tpm(1_000_000)));
    let gw = c.start().await;
    let r = post(
        &gw,
        KEY,
        "/responses",
        &json!({"model": "gpt-4o-mini", "input": "Hello."}),
    )
    .await;
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(b.state.request_count(), 1, "priority: b first");
    gw.settled().await;
    // b has little room left; a has plenty. A follow-up that fits b goes to b.
    let follow = json!({"model": "gpt-4o-mini", "input": "Again.", "previous_response_id": id, "max_output_tokens": 16});
    assert_eq!(post(&gw, KEY, "/responses", &follow).await.status(), 200);
    assert_eq!(b.state.request_count(), 2);
    assert_eq!(a.state.request_count(), 0);
    // One that does not fit b: 429, and a never sees it.
    let mut big = follow.clone();
    big["input"] = json!("word ".repeat(400));
    assert_eq!(post(&gw, KEY, "/responses", &big).await.status(), 429);
    assert_eq!(a.state.request_count(), 0);
    // Without previous_response_id the same body goes to a.
    big.as_object_mut().unwrap().remove("previous_response_id");
    assert_eq!(post(&gw, KEY, "/responses", &big).await.status(), 200);
    assert_eq!(a.state.request_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrecorded_ids_are_forwarded_only_by_opt_in_with_an_allowance() {
    let mock = start_mock().await;
    let mut c = cfg(&mock, 100, limits());
    c.tenant("t1").allow_unrecorded_previous_response = Some(true);
    c.tenant("t1").unrecorded_previous_response_tokens = Some(500);
    let gw = c.start().await;
    let body =
        json!({"model": "gpt-4o-mini", "input": "Hi.", "previous_response_id": "resp_from_before"});
    let r = post(&gw, KEY, "/responses/input_tokens", &body).await;
    let with = r.json::<Value>().await.unwrap()["input_tokens"]
        .as_u64()
        .unwrap();
    let r = post(
        &gw,
        KEY,
        "/responses/input_tokens",
        &json!({"model": "gpt-4o-mini", "input": "Hi."}),
    )
    .await;
    let without = r.json::<Value>().await.unwrap()["input_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(with, without + 500);
    // Forwarded (the mock does not know it either: its 404 is passed on).
    let r = post(&gw, KEY, "/responses", &body).await;
    assert_eq!(r.status(), 404);
    assert_eq!(mock.state.request_count(), 1);
    assert!(gw
        .metrics_text()
        .await
        .contains("budgetgate_unrecorded_previous_response_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_metered_or_isolated_is_refused_naming_the_field() {
    let mock = start_mock().await;
    let mut c = cfg(&mock, 100, limits());
    c.tenant("t1").allowed_provider_objects = vec!["file-ok".into()];
    let gw = c.start().await;
    let base = json!({"model": "gpt-4o-mini", "input": "Hi."});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let cases = [
        (with("conversation", json!("conv_1")), "conversation"),
        (with("prompt", json!({"id": "pmpt_1"})), "prompt"),
        (
            with(
                "input",
                json!([{"role": "user", "content": [{"type": "input_file", "file_id": "file-x"}]}]),
            ),
            "input[0].content[0].file_id",
        ),
        (
            with("tools", json!([{"type": "web_search"}])),
            "tools[0].type",
        ),
        (
            with(
                "tools",
                json!([{"type": "file_search", "vector_store_ids": ["vs_1"]}]),
            ),
            "tools[0].type",
        ),
        (with("background", json!(true)), "background"),
    ];
    for (body, param) in cases {
        let r = post(&gw, KEY, "/responses", &body).await;
        assert_eq!(r.status(), 400, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["param"], param, "{e}");
        assert!(e["error"]["message"].as_str().unwrap().len() > 40);
    }
    assert_eq!(mock.state.request_count(), 0, "none reached the upstream");
    // An allow-listed file id passes.
    let ok = with(
        "input",
        json!([{"role": "user", "content": [{"type": "input_file", "file_id": "file-ok"}]}]),
    );
    assert_eq!(post(&gw, KEY, "/responses", &ok).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_allowed_by_the_model_is_charged_the_whole_reservation() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(10);
    let mut c = cfg(&mock, 100, limits());
    c.model("gpt-4o-mini").allow_background = Some(true);
    let gw = c.start().await;
    let body = json!({"model": "gpt-4o-mini", "input": "Hi.", "background": true});
    let input = {
        let r = post(&gw, KEY, "/responses/input_tokens", &body).await;
        r.json::<Value>().await.unwrap()["input_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(post(&gw, KEY, "/responses", &body).await.status(), 200);
    gw.settled().await;
    assert_eq!(tokens_used(&gw).await, input + 100, "never refunded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_tokens_is_answered_by_the_estimator_and_charges_request_budgets_only() {
    let mock = start_mock().await;
    let gw = cfg(&mock, 100, limits().rpm(100).tpm(1000)).start().await;
    let body = json!({"model": "gpt-4o-mini", "instructions": "Be kind.", "input": "Hello there."});
    let r = post(&gw, KEY, "/responses/input_tokens", &body).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-ratelimit-remaining-requests"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "response.input_tokens");
    let bpe = tiktoken_rs::o200k_base_singleton();
    let t = |s: &str| bpe.encode_ordinary(s).len() as u64;
    let expected = 3 + t("developer") + t("Be kind.") + 3 + t("user") + t("Hello there.") + 3;
    assert_eq!(v["input_tokens"].as_u64().unwrap(), expected);
    gw.settled().await;
    assert_eq!(mock.state.request_count(), 0);
    assert_eq!(tokens_used(&gw).await, 0);
    assert_eq!(used(&gw, BudgetName::RequestsPerDay).await, 1);
}

#[test]
fn check_config_rejects_a_minimum_below_16_for_models_on_the_responses_route() {
    let base = |responses: Option<bool>, min: u64| {
        let mut c = TestConfig::new();
        c.estimation.min_output_tokens = Some(min as i64);
        c.upstreams
            .push(upstream("u", Kind::Openai, "http://127.0.0.1:1/v1"));
        c.models.push(RawModel {
            responses,
            ..model("m", &["u"])
        });
        Policy::from_toml(&c.render())
    };
    let err = base(None, 8).unwrap_err().to_string();
    assert!(
        err.contains("min_output_tokens") && err.contains("/v1/responses"),
        "{err}"
    );
    assert!(base(Some(false), 8).is_ok());
    assert!(base(None, 16).is_ok());
    // Azure before 2025-03-01-preview cannot serve the route: asking for it is a load error.
    let azure = |version: &str, responses: Option<bool>| {
        let mut c = TestConfig::new();
        c.upstreams.push(Upstream {
            api_version: Some(version.into()),
            ..upstream("az", Kind::Azure, "https://x.openai.azure.com")
        });
        c.models.push(RawModel {
            responses,
            ..model("m", &["az"])
        });
        Policy::from_toml(&c.render())
    };
    let err = azure("2024-10-21", Some(true)).unwrap_err().to_string();
    assert!(err.contains("responses"), "{err}");
    let p = azure("2024-10-21", None).unwrap();
    assert!(!p.models[0].responses, "not served by default");
    assert!(azure("2025-04-01-preview", Some(true)).unwrap().models[0].responses);
}

#[test]
fn each_upstream_kind_builds_its_responses_url() {
    let mut c = TestConfig::new();
    c.upstreams
        .push(upstream("oa", Kind::Openai, "https://api.openai.com/v1"));
    c.upstreams
        .push(upstream("sh", Kind::SelfHosted, "http://127.0.0.1:8000/v1"));
    c.upstreams.push(Upstream {
        api_version: Some("2025-04-01-preview".into()),
        ..upstream("az", Kind::Azure, "https://x.openai.azure.com")
    });
    c.models.push(model("m", &["oa", "sh", "az"]));
    let p = c.policy();
    use budgetgate::dialects::Dialect;
    use budgetgate::upstreams::{endpoint_url, responses_url};
    let url = |i: usize| endpoint_url(&p.upstreams[i], Dialect::Responses, "gpt-x");
    assert_eq!(url(0), "https://api.openai.com/v1/responses");
    assert_eq!(url(1), "http://127.0.0.1:8000/v1/responses");
    assert_eq!(
        url(2),
        "https://x.openai.azure.com/openai/responses?api-version=2025-04-01-preview"
    );
    assert_eq!(
        responses_url(&p.upstreams[2], "/resp_1/input_items?limit=5"),
        "https://x.openai.azure.com/openai/responses/resp_1/input_items?api-version=2025-04-01-preview&limit=5"
    );
    assert_eq!(
        responses_url(&p.upstreams[0], "/resp_1/cancel"),
        "https://api.openai.com/v1/responses/resp_1/cancel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_creates_streams_calls_tools_and_follows_up_settled_exactly() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(12);
    let gw = cfg(&mock, 100, limits().tpm(100_000)).start().await;
    let r = run_python("sdk_responses.py", &gw.base_url(), &["basic"])
        .await
        .json();
    gw.settled().await;
    let reqs = r["requests"].as_array().expect("requests");
    let kinds: Vec<&str> = reqs.iter().map(|q| q["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "create",
            "create_stream",
            "stream_helper",
            "tool_call",
            "tool_result",
            "follow_up"
        ]
    );
    let words = mock_upstream::generated_text(12);
    assert_eq!(reqs[0]["status"], "completed");
    assert_eq!(reqs[0]["text"], words.as_str());
    assert_eq!(reqs[1]["last"], "response.completed");
    assert_eq!(reqs[1]["text"], words.as_str());
    assert_eq!(reqs[1]["final_text"], words.as_str());
    assert_eq!(reqs[2]["last"], "response.completed");
    assert_eq!(reqs[2]["text"], words.as_str());
    assert_eq!(reqs[3]["item"], "function_call");
    assert_eq!(reqs[3]["name"], "lookup");
    assert_eq!(reqs[3]["arguments"]["q"], words.as_str());
    assert_eq!(reqs[4]["item"], "message");
    assert_eq!(reqs[5]["status"], "completed");
    let total = |q: &Value| q["usage"]["total_tokens"].as_u64().unwrap();
    // The follow-up's input is the recorded context (the first response) + its own.
    assert!(reqs[5]["usage"]["input_tokens"].as_u64().unwrap() > total(&reqs[0]));
    // Settled exactly: the sum of the terminal usages.
    let sum: u64 = reqs.iter().map(total).sum();
    assert_eq!(tokens_used(&gw).await, sum);
    // Refunds visible in the next request's x-ratelimit-remaining-tokens:
    // remaining(next) = remaining(prev) + reserved(prev) − settled(prev) − reserved(next),
    // where a plain-text request reserves its input (the estimate equals the
    // upstream's count for text) + the default cap of 100.
    let reserved = |q: &Value| q["usage"]["input_tokens"].as_u64().unwrap() + 100;
    let remaining = |q: &Value| {
        q["remaining"]
            .as_i64()
            .expect("x-ratelimit-remaining-tokens")
    };
    for i in 0..2 {
        let (p, n) = (&reqs[i], &reqs[i + 1]);
        assert_eq!(
            remaining(n),
            remaining(p) + reserved(p) as i64 - total(p) as i64 - reserved(n) as i64,
            "request {i} → {}",
            i + 1
        );
    }
    assert_eq!(gw.memory().live_holds(), 0);
    // Every upstream body carried no cap (as its client's) or one ≥ 16,
    // and never include_usage.
    for q in mock.state.requests() {
        let cap = q.body.get("max_output_tokens");
        assert!(cap.is_none_or(|c| c.as_u64().unwrap() >= 16), "{}", q.body);
        assert!(q.body.pointer("/stream_options/include_usage").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_reads_a_cutoff_to_the_end_in_both_styles() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(2000);
    let gw = cfg(&mock, 50, limits().tpm(400)).start().await;
    let r = run_python("sdk_responses.py", &gw.base_url(), &["cutoff", "create"])
        .await
        .json();
    gw.settled().await;
    let c = &r["create"];
    assert_eq!(c["raised"], Value::Null, "{r}");
    assert_eq!(c["last"], "response.incomplete");
    assert_eq!(c["status"], "incomplete");
    // A minute later the bucket is full again; the helper style.
    gw.clock.advance(60_000_000);
    let r2 = run_python("sdk_responses.py", &gw.base_url(), &["cutoff", "helper"])
        .await
        .json();
    gw.settled().await;
    let h = &r2["helper"];
    assert_eq!(h["raised"], Value::Null, "{r2}");
    assert_eq!(h["last"], "response.incomplete");
    assert!(
        h["final_response_error"].is_string(),
        "get_final_response raises on a non-completed response by SDK design: {r2}"
    );
    // Charged prompt + delivered output, as the incomplete events' usage says.
    let first = c["usage"]["total_tokens"].as_u64().unwrap();
    assert!(c["usage"]["output_tokens"].as_u64().unwrap() > 0);
    let second = h["usage"]["total_tokens"].as_u64().unwrap();
    assert_eq!(tokens_used(&gw).await, first + second);
    assert_eq!(gw.memory().live_holds(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_raises_api_error_on_a_dropped_stream() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20);
    mock.state.set_fault(Some(Fault::DropMidStream));
    let gw = cfg(&mock, 100, limits()).start().await;
    let r = run_python("sdk_responses.py", &gw.base_url(), &["error"])
        .await
        .json();
    assert_eq!(r["raised"]["is_api_error"], true, "{r}");
    gw.settled().await;
    assert_eq!(gw.memory().live_holds(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_model_is_never_extended_its_cap_goes_upstream() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(300);
    let mut c = cfg(&mock, 40, limits());
    c.model("gpt-4o-mini").reasoning = Some(true);
    // No bound known: the reservation is the cap (with a bound the stream
    // goes uncapped: `uncapped::`).
    c.model("gpt-4o-mini").max_output_tokens = None;
    let gw = c.start().await;
    let evs = stream_events(
        &gw,
        &json!({"model": "gpt-4o-mini", "input": "Think.", "stream": true}),
    )
    .await;
    // The reservation's output (40) is the cap upstream; the upstream stops there.
    assert_eq!(last_upstream_body(&mock)["max_output_tokens"], 40);
    let (name, last) = evs.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(text_deltas(&evs), 40);
    gw.settled().await;
    assert_eq!(
        tokens_used(&gw).await,
        last["response"]["usage"]["total_tokens"].as_u64().unwrap()
    );
}

/// Owner records in a real Redis: one key per record under its own hash
/// tag (the response id), with the TTL, read back, deleted; and the
/// gateway on the Redis store keeps tenants apart through them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_records_live_in_redis_under_their_own_hash_tag() {
    use budgetgate::budget::records::ResponseRecord;
    use budgetgate::budget::redis::records::RedisRecords;
    let server = crate::support::redis_server::RedisServer::start();
    let records = RedisRecords::new(
        &server.url(),
        "bgtest",
        std::time::Duration::from_secs(2),
        std::time::Duration::from_secs(3600),
    );
    let rec = ResponseRecord {
        tenant: "t1".into(),
        model: "gpt-4o-mini".into(),
        deployment: "mock".into(),
        context_tokens: 123,
    };
    records.put("resp_abc", &rec).await.unwrap();
    assert_eq!(records.key("resp_abc"), "bgtest:{resp_abc}:v3:resp");
    assert_eq!(records.get("resp_abc").await.unwrap(), Some(rec.clone()));
    let ttl: i64 = server
        .cli(&["PTTL", "bgtest:{resp_abc}:v3:resp"])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{ttl}");
    let stored = server.cli(&["GET", "bgtest:{resp_abc}:v3:resp"]);
    assert!(stored.trim().len() <= 40, "compact: {stored}");
    records.delete("resp_abc").await.unwrap();
    assert_eq!(records.get("resp_abc").await.unwrap(), None);

    // Through the gateway on the Redis store.
    let mock = start_mock().await;
    let gw = cfg(&mock, 100, limits()).redis(&server.url()).start().await;
    let r = post(
        &gw,
        KEY,
        "/responses",
        &json!({"model": "gpt-4o-mini", "input": "Hi."}),
    )
    .await;
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    gw.settled().await;
    let n = mock.state.request_count();
    let follow = json!({"model": "gpt-4o-mini", "input": "More.", "previous_response_id": id});
    assert_eq!(post(&gw, KEY2, "/responses", &follow).await.status(), 404);
    assert_eq!(mock.state.request_count(), n);
    assert_eq!(post(&gw, KEY, "/responses", &follow).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_hosted_upstream_that_ignores_the_cap_is_cut_off_at_it() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(200);
    mock.state.set_fault(Some(Fault::MaxTokensOnly));
    let gw = cfg(&mock, 100, limits()).start().await;
    let evs = stream_events(
        &gw,
        &json!({"model": "gpt-4o-mini", "input": "Go on.", "stream": true, "max_output_tokens": 30}),
    )
    .await;
    let (name, last) = evs.last().unwrap();
    assert_eq!(name, "response.incomplete");
    // Tolerance: max(2 % of the cap, one delta) = 1 token.
    let delivered = text_deltas(&evs);
    assert_eq!(delivered, 31);
    assert_eq!(last["response"]["usage"]["output_tokens"], 31);
    gw.settled().await;
    let input = last["response"]["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(tokens_used(&gw).await, input + delivered);
}

/// Fault guarded against: `POST /v1/responses/input_tokens` answered 429
/// for a body past a token budget's capacity, where the count is what the
/// client asks for (to trim the body) and `/v1/messages/count_tokens`
/// answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_tokens_answers_the_count_past_a_token_budgets_capacity() {
    let mock = start_mock().await;
    // tpm 200: a prompt of about 600 tokens can never be sent.
    let gw = cfg(&mock, 50, limits().tpm(200)).start().await;
    let long = "word ".repeat(600);
    let body = json!({"model": "gpt-4o-mini", "input": long});
    let r = post(&gw, KEY, "/responses", &body).await;
    assert_eq!(r.status(), 429, "the request itself never fits");
    gw.settled().await;
    let requests_before = used(&gw, BudgetName::RequestsPerDay).await;
    let r = post(&gw, KEY, "/responses/input_tokens", &body).await;
    assert_eq!(r.status(), 200);
    assert!(
        header(&r, "ratelimit").is_some_and(|v| v.contains("tenant-requests-per-day")),
        "the request budgets it was charged to: {:?}",
        r.headers()
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "response.input_tokens");
    let n = v["input_tokens"].as_u64().unwrap();
    assert!(n >= 600, "{v}");
    assert_eq!(mock.state.request_count(), 0, "never sent upstream");
    gw.settled().await;
    assert_eq!(
        used(&gw, BudgetName::RequestsPerDay).await,
        requests_before + 1,
        "the count is charged as one request"
    );
    assert_eq!(tokens_used(&gw).await, 0, "no token is spent");
}
