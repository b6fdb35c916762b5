//! The Gemini API as a dialect and Gemini upstreams: requests on
//! `/v1beta/models/{model}:generateContent` (and `:countTokens`,
//! `GET /v1beta/models`) through the gateway to the mock Gemini API
//! (`examples/mock_upstream/gemini.rs`: it checks the deployment's key)
//! and to Gemini on the mock Vertex (its bearer token checked as for
//! Claude). Budgets move by `usageMetadata` as the dialect reads it:
//! input = prompt + tool-use prompt (cached part of it), output =
//! candidates + thoughts.

use budgetgate::budget::{BudgetName, Scope};
use budgetgate::config::raw::RawUpstream;
use budgetgate::config::vertex::RawVertex;
use serde_json::{json, Value};

use crate::support::mock_upstream::gemini::prompt_tokens;
use crate::support::mock_upstream::vertex::VertexMock;
use crate::support::*;

/// The deployment's key: the value of `CARGO_PKG_NAME`, which every
/// test process has (no environment is changed).
pub(crate) const UPSTREAM_KEY: &str = "budgetgate";
pub(crate) const MODEL: &str = "gemini-test";

/// The mock Vertex serving the project in `us-east5` (its Gemini
/// simulation in `state.messages.gemini`).
pub(crate) async fn start_vertex() -> VertexMock {
    crate::support::mock_upstream::vertex::start("acme-prod", crate::vertex::EAST)
        .await
        .expect("mock vertex")
}

/// A `kind = "gemini"` deployment of the mock at `root`.
pub(crate) fn studio(name: &str, root: &str) -> RawUpstream {
    RawUpstream {
        name: name.into(),
        kind: Some("gemini".into()),
        base_url: format!("{root}/v1beta"),
        api_key_env: Some("CARGO_PKG_NAME".into()),
        ..RawUpstream::default()
    }
}

/// A Vertex Gemini deployment of `m` in `region` with an
/// `authorized_user` credentials file whose refresh token the mock knows.
pub(crate) fn vertex_gemini(
    name: &str,
    m: &VertexMock,
    region: &str,
    dir: &std::path::Path,
) -> RawUpstream {
    m.state.add_refresh_token("1//gemini-refresh");
    let file = dir.join(format!("{name}-adc.json"));
    std::fs::write(
        &file,
        json!({"type": "authorized_user", "client_id": "id.apps.googleusercontent.com",
               "client_secret": "d-secret", "refresh_token": "1//gemini-refresh",
               "token_uri": format!("{}/token", m.root_url())})
        .to_string(),
    )
    .expect("write the credentials file");
    RawUpstream {
        name: name.into(),
        kind: Some("vertex".into()),
        base_url: m.root_url(),
        vertex: Some(RawVertex {
            project: Some("acme-prod".into()),
            region: Some(region.into()),
            credentials_file: Some(file.display().to_string()),
            publisher: Some("google".into()),
        }),
        ..RawUpstream::default()
    }
}

/// `gemini-test` served by `upstreams` in order, tenant `t1`.
pub(crate) fn config(upstreams: Vec<RawUpstream>, tenant_limits: Limits) -> TestConfig {
    let mut c = TestConfig::new();
    c.estimation.stream_extension_step = Some(64);
    let names: Vec<String> = upstreams.iter().map(|u| u.name.clone()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    c.upstreams = upstreams;
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        token_ratio: Some(1000),
        ..config::model(MODEL, &names)
    });
    c.tenants
        .push(config::tenant("t1", "k1", KEY, tenant_limits));
    c
}

fn body(max_output: Option<u64>) -> Value {
    let mut b = json!({"contents": [{"role": "user", "parts": [{"text": "Say hello to the budget gate"}]}]});
    if let Some(m) = max_output {
        b["generationConfig"] = json!({"maxOutputTokens": m});
    }
    b
}

fn url(root: &str, model: &str, method: &str) -> String {
    format!("{root}/v1beta/models/{model}:{method}")
}

async fn generate(root: &str, b: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url(root, MODEL, "generateContent"))
        .header("x-goog-api-key", KEY)
        .json(b)
        .send()
        .await
        .expect("POST generateContent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generate_call_goes_to_the_gemini_api_with_the_deployments_key_and_settles_its_usage() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20);
    mock.state.gemini.set_api_key(Some(UPSTREAM_KEY));
    let gw = config(
        vec![studio("studio", &mock.root_url())],
        limits().rpm(100).tpm(100_000),
    )
    .start()
    .await;
    let b = body(Some(100));
    let r = generate(&gw.root_url(), &b).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "x-ratelimit-remaining-tokens").is_some());
    let v: Value = r.json().await.unwrap();
    let prompt = prompt_tokens(&b);
    assert_eq!(v["usageMetadata"]["promptTokenCount"], prompt);
    assert_eq!(v["usageMetadata"]["candidatesTokenCount"], 20);
    assert_eq!(v["candidates"][0]["finishReason"], "STOP");

    let sent = mock.state.gemini.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].model, MODEL);
    assert_eq!(sent[0].method, "generateContent");
    assert_eq!(sent[0].key.as_deref(), Some(UPSTREAM_KEY));
    assert_eq!(sent[0].query, None, "nothing of the client's query");
    assert_eq!(sent[0].body["generationConfig"]["maxOutputTokens"], 100);
    assert_no_header_holds(&mock.state.requests(), KEY);

    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Rpm).await, 1);
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, prompt + 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thoughts_tool_use_and_cached_tokens_settle_by_the_documented_rules() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20);
    mock.state.gemini.set_thoughts(30);
    mock.state.gemini.set_cached(3);
    mock.state.gemini.set_tool_use_prompt(7);
    let gw = config(
        vec![studio("studio", &mock.root_url())],
        limits().tpm(100_000).input_tpm(100_000).output_tpm(100_000),
    )
    .start()
    .await;
    let mut b = body(Some(200));
    b["generationConfig"]["thinkingConfig"] = json!({"thinkingBudget": 64});
    let r = generate(&gw.root_url(), &b).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let u = &v["usageMetadata"];
    assert_eq!(u["thoughtsTokenCount"], 30);
    assert_eq!(u["cachedContentTokenCount"], 3);
    assert_eq!(u["toolUsePromptTokenCount"], 7);
    let prompt = prompt_tokens(&b);
    assert_eq!(
        u["totalTokenCount"].as_u64(),
        Some(prompt + 7 + 20 + 30),
        "the mock's total is the sum"
    );
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::InputTpm).await, prompt + 7);
    assert_eq!(gw.t1_used(BudgetName::OutputTpm).await, 20 + 30);
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, prompt + 7 + 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_the_query_is_accepted_and_never_forwarded_or_logged() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(
        vec![studio("studio", &mock.root_url())],
        limits().tpm(10_000),
    );
    c.upstreams[0].base_url = format!("{}/v1beta", mock.root_url());
    let gw = GatewayProcess::start(&c.write(dir.path()), &[]).await;
    let r = reqwest::Client::new()
        .post(format!(
            "{}?key={KEY}",
            url(&gw.root_url(), MODEL, "generateContent")
        ))
        .json(&body(Some(10)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A wrong key in the query is refused in Google's shape.
    let r = reqwest::Client::new()
        .post(format!(
            "{}?key=sk-not-a-key",
            url(&gw.root_url(), MODEL, "generateContent")
        ))
        .json(&body(Some(10)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["status"], "UNAUTHENTICATED", "{v}");
    let sent = mock.state.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].query, None);
    assert_no_header_holds(&sent, KEY);
    gw.wait_log("request finished", 1).await;
    gw.wait_log("request refused", 1).await;
    let logs = gw.dump_logs();
    assert!(!logs.contains(KEY), "the key reached the log");
    assert!(
        !logs.contains("sk-not-a-key"),
        "the wrong key reached the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_name_that_could_reach_another_resource_is_a_404_that_reaches_no_upstream() {
    let mock = start_mock().await;
    let gw = config(
        vec![studio("studio", &mock.root_url())],
        limits().tpm(10_000),
    )
    .start()
    .await;
    for model in [
        "gemini-test%2F..%2Fother",
        "gemini-test%2f",
        "..gemini-test",
        "gemini-test..",
        "%2E%2E",
        "unknown-model",
    ] {
        let r = reqwest::Client::new()
            .post(url(&gw.root_url(), model, "generateContent"))
            .header("x-goog-api-key", KEY)
            .json(&body(Some(10)))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{model}");
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(v["error"]["code"], 404, "{model}: {v}");
    }
    assert_eq!(
        mock.state.request_count(),
        0,
        "nothing reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_in_googles_shape_with_retry_info_and_the_window_of_the_budget() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(150);
    let gw = config(
        vec![studio("studio", &mock.root_url())],
        limits().rpm(1).tokens_per_day(200),
    )
    .start()
    .await;
    assert_eq!(
        generate(&gw.root_url(), &body(Some(150))).await.status(),
        200
    );
    let r = generate(&gw.root_url(), &body(Some(150))).await;
    assert_eq!(r.status(), 429);
    let retry_after = must_header(&r, "retry-after");
    let v: Value = r.json().await.unwrap();
    let e = &v["error"];
    assert_eq!(e["code"], 429);
    assert_eq!(e["status"], "RESOURCE_EXHAUSTED");
    let details = e["details"].as_array().cloned().unwrap_or_default();
    let of = |t: &str| {
        details
            .iter()
            .find(|d| d["@type"] == format!("type.googleapis.com/google.rpc.{t}"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(of("RetryInfo")["retryDelay"], format!("{retry_after}s"));
    let quota_id = of("QuotaFailure")["violations"][0]["quotaId"]
        .as_str()
        .unwrap_or("")
        .to_string();
    // The minute's one request and the day's tokens are both spent; the
    // tightest names itself.
    assert!(
        ["RequestsPerMinute", "TokensPerDay"].contains(&quota_id.as_str()),
        "{v}"
    );
    assert_eq!(mock.state.request_count(), 1);

    // The day's tokens alone: a quota (Gemini CLI stops on `PerDay`).
    gw.clock.advance(61_000_000);
    let r = generate(&gw.root_url(), &body(Some(150))).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    let details = v["error"]["details"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let quota = details
        .iter()
        .find(|d| d["@type"] == "type.googleapis.com/google.rpc.QuotaFailure")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(quota["violations"][0]["quotaId"], "TokensPerDay", "{v}");
    let info = details
        .iter()
        .find(|d| d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(info["reason"], "QUOTA_EXHAUSTED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_is_answered_by_the_gateway_and_the_model_list_names_gemini_models() {
    let mock = start_mock().await;
    let gw = config(
        vec![studio("studio", &mock.root_url())],
        limits().tpm(10_000),
    )
    .start()
    .await;
    let client = reqwest::Client::new();
    let r = client
        .post(url(&gw.root_url(), MODEL, "countTokens"))
        .header("x-goog-api-key", KEY)
        .json(&body(None))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let counted = v["totalTokens"].as_u64().unwrap_or(0);
    // The estimate bounds the mock's count (text at ratio 1000 plus framing).
    assert!(counted >= prompt_tokens(&body(None)), "{v}");
    let r = client
        .get(format!("{}/v1beta/models", gw.root_url()))
        .header("authorization", format!("Bearer {KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["models"][0]["name"], format!("models/{MODEL}"), "{v}");
    assert_eq!(mock.state.request_count(), 0, "no upstream call");
    gw.all_settled().await;
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_vertex_region_cools_down_and_another_serves_the_request() {
    let m = start_vertex().await;
    m.state.messages.set_output_tokens(20);
    m.state.throttle_region(crate::vertex::EAST);
    m.state.serve("acme-prod", "europe-west4");
    let dir = tempfile::tempdir().unwrap();
    let mut east = vertex_gemini("east", &m, crate::vertex::EAST, dir.path());
    let mut west = vertex_gemini("west", &m, "europe-west4", dir.path());
    east.limits = limits().tpm(100_000);
    west.limits = limits().tpm(100_000);
    let gw = config(vec![east, west], limits().tpm(100_000))
        .start()
        .await;
    let b = body(Some(50));
    for _ in 0..2 {
        let r = generate(&gw.root_url(), &b).await;
        assert_eq!(r.status(), 200, "no client-visible error");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["usageMetadata"]["candidatesTokenCount"], 20);
    }
    let regions: Vec<String> = m
        .state
        .requests()
        .iter()
        .map(|r| r.region.clone())
        .collect();
    assert_eq!(
        regions,
        [crate::vertex::EAST, "europe-west4", "europe-west4"],
        "east once, then cooling down"
    );
    let sent = m.state.messages.gemini.requests();
    assert!(sent
        .iter()
        .all(|r| r.surface == "vertex" && r.model == MODEL));
    gw.all_settled().await;
    let prompt = prompt_tokens(&b);
    assert_eq!(
        gw.used(Scope::Upstream("east".into()), BudgetName::Tpm)
            .await,
        0
    );
    assert_eq!(
        gw.used(Scope::Upstream("west".into()), BudgetName::Tpm)
            .await,
        2 * (prompt + 20)
    );
    assert_eq!(gw.t1_used(BudgetName::Tpm).await, 2 * (prompt + 20));
}

/// One tenant, three deployments: the Gemini API, Vertex Gemini and an
/// OpenAI-compatible server. The same budgets move by what each
/// upstream's usage reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_budgets_move_by_each_upstreams_usage() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(20);
    mock.state.gemini.set_thoughts(10);
    let m = start_vertex().await;
    m.state.messages.set_output_tokens(30);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(
        vec![
            studio("studio", &mock.root_url()),
            vertex_gemini("east", &m, crate::vertex::EAST, dir.path()),
            config::upstream("openai", Kind::SelfHosted, &mock.base_url()),
        ],
        limits().tpm(100_000),
    );
    c.models[0].upstreams = vec!["studio".into()];
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        token_ratio: Some(1000),
        default_max_output_tokens: Some(256),
        ..config::model("gemini-vertex", &["east"])
    });
    c.models.push(config::RawModel {
        encoding: Some("o200k_base".into()),
        default_max_output_tokens: Some(256),
        ..config::model("gpt-4o-mini", &["openai"])
    });
    let gw = c.start().await;
    let b = body(Some(100));
    let mut studio_body = b.clone();
    studio_body["generationConfig"]["thinkingConfig"] = json!({"thinkingBudget": 50});
    assert_eq!(generate(&gw.root_url(), &studio_body).await.status(), 200);
    let r = reqwest::Client::new()
        .post(url(&gw.root_url(), "gemini-vertex", "generateContent"))
        .header("x-goog-api-key", KEY)
        .json(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let chat = json!({"model": "gpt-4o-mini", "max_tokens": 100,
                      "messages": [{"role": "user", "content": "Say hello to the budget gate"}]});
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gw.root_url()))
        .bearer_auth(KEY)
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let chat_total = v["usage"]["total_tokens"].as_u64().unwrap_or(0);
    gw.all_settled().await;
    let prompt = prompt_tokens(&b);
    let studio_used = prompt + 20 + 10;
    let vertex_used = prompt + 30;
    assert_eq!(
        gw.t1_used(BudgetName::Tpm).await,
        studio_used + vertex_used + chat_total
    );
}

/// Two keys of one Gemini API project: deployments naming one `project`
/// share its budgets, so the project's one request a minute is spent by
/// either; without `project`, each deployment would admit its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deployments_of_one_project_share_its_budgets() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5);
    let mut a = studio("key-a", &mock.root_url());
    let mut b = studio("key-b", &mock.root_url());
    for u in [&mut a, &mut b] {
        u.project = Some("project-1".into());
        u.limits = limits().rpm(1);
    }
    let gw = config(vec![a, b], limits().rpm(100)).start().await;
    assert_eq!(
        generate(&gw.root_url(), &body(Some(10))).await.status(),
        200
    );
    let r = generate(&gw.root_url(), &body(Some(10))).await;
    assert_eq!(r.status(), 429, "the project's minute is spent");
    assert_eq!(mock.state.request_count(), 1);
    gw.all_settled().await;
    assert_eq!(
        gw.used(Scope::Upstream("project-1".into()), BudgetName::Rpm)
            .await,
        1
    );
}

/// The input estimate at a Gemini model's default `token_ratio` bounds
/// every count Google's API reported for a request of the committed
/// corpus (`tests/fixtures/gemini_counts.json`, each entry citing its
/// source); the over-reservation is printed (`--nocapture`).
#[test]
fn gemini_estimate_bounds_the_reported_counts() {
    let text = std::fs::read_to_string(repo_path("tests/fixtures/gemini_counts.json"))
        .expect("the corpus");
    let corpus: Value = serde_json::from_str(&text).expect("corpus JSON");
    let entries = corpus["entries"].as_array().cloned().unwrap_or_default();
    assert!(entries.len() >= 8, "{}", entries.len());
    let ratio = budgetgate::config::gemini::DEFAULT_TOKEN_RATIO;
    let (mut estimated, mut reported) = (0u64, 0u64);
    for e in &entries {
        let request = e["request"].as_object().cloned().unwrap_or_default();
        let got = budgetgate::estimate::gemini::input_tokens(
            &request,
            budgetgate::config::estimate::Encoding::O200kBase,
            ratio,
        )
        .unwrap_or_else(|err| panic!("{}: {err}", e["name"]));
        let want = e["reported"].as_u64().unwrap_or(u64::MAX);
        println!(
            "{:<20} reported {:>6}  estimated {:>6}  ratio {:.2}",
            e["name"].as_str().unwrap_or(""),
            want,
            got,
            got as f64 / want as f64
        );
        assert!(
            got >= want,
            "{}: estimated {got} < reported {want}",
            e["name"]
        );
        estimated += got;
        reported += want;
    }
    println!(
        "over-reservation: {:.3} (estimated {estimated} / reported {reported} tokens over {} requests)",
        estimated as f64 / reported as f64,
        entries.len()
    );
}

/// The google-genai SDK (pinned in `tests/python/requirements.txt`):
/// generate, stream, count tokens and a function call through the
/// gateway; then a refusal it raises as `ClientError` 429 with Google's
/// details.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_google_genai_sdk_generates_streams_counts_calls_a_function_and_reads_a_429() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(6);
    let gw = config(
        vec![studio("studio", &mock.root_url())],
        limits().rpm(5).tpm(100_000),
    )
    .start()
    .await;
    let v = run_python("gemini_sdk.py", &gw.root_url(), &["basic"])
        .await
        .json();
    let six = mock_upstream::generated_text(6);
    assert_eq!(v["text"], six, "{v}");
    assert_eq!(v["finish"], "STOP");
    assert_eq!(v["usage"]["candidates_token_count"], 6, "{v}");
    assert_eq!(v["stream_text"], six);
    assert_eq!(v["stream_finish"], "STOP");
    assert_eq!(v["stream_usage"]["candidates_token_count"], 6, "{v}");
    assert!(v["count"].as_u64().is_some_and(|n| n > 0), "{v}");
    assert_eq!(v["function_call"]["name"], "get_weather", "{v}");
    assert_eq!(v["function_call"]["args"]["location"], "Boston");
    // Four model calls (countTokens is the gateway's own): the fifth of
    // the minute is refused.
    assert_eq!(mock.state.gemini.requests().len(), 3);
    let v = run_python("gemini_sdk.py", &gw.root_url(), &["rate_limited"])
        .await
        .json();
    assert_eq!(
        v["error"],
        Value::Null,
        "the fifth request of the minute is admitted"
    );
    let v = run_python("gemini_sdk.py", &gw.root_url(), &["rate_limited"])
        .await
        .json();
    let e = &v["error"];
    assert_eq!(e["code"], 429, "{v}");
    assert_eq!(e["status"], "RESOURCE_EXHAUSTED");
    let details = e["details"]["error"]["details"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        details
            .iter()
            .any(|d| d["@type"] == "type.googleapis.com/google.rpc.RetryInfo"),
        "{v}"
    );
}

/// Streams in both framings: SSE (`alt=sse`) and one JSON array. Each
/// ends cleanly; cut off at the budget, each ends as Gemini ends a stream
/// at its output limit: a last chunk with `finishReason: "MAX_TOKENS"`
/// and the usage, the array closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_end_cleanly_in_both_forms_and_a_cutoff_ends_with_max_tokens() {
    let mock = start_mock().await;
    let b = body(None);
    let prompt_estimate =
        5 + budgetgate::config::estimate::Encoding::O200kBase.count("Say hello to the budget gate");
    for sse in [true, false] {
        for cut in [false, true] {
            mock.state.set_output_tokens(if cut { 600 } else { 20 });
            let mut c = config(
                vec![studio("studio", &mock.root_url())],
                // The first reservation (256) and one extension (64) fit.
                limits().tpm(prompt_estimate + 256 + 64 + 10),
            );
            c.models[0].max_output_tokens = Some(1000);
            let gw = c.start().await;
            let query = if sse { "?alt=sse" } else { "" };
            let r = reqwest::Client::new()
                .post(format!(
                    "{}{query}",
                    url(&gw.root_url(), MODEL, "streamGenerateContent")
                ))
                .header("x-goog-api-key", KEY)
                .json(&b)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let ct = header(&r, "content-type").unwrap_or_default();
            let text = r.text().await.unwrap();
            let chunks: Vec<Value> = if sse {
                assert!(ct.starts_with("text/event-stream"), "{ct}");
                text.split("\r\n\r\n")
                    .filter_map(|e| e.trim().strip_prefix("data: "))
                    .map(|d| serde_json::from_str(d).unwrap_or(Value::Null))
                    .collect()
            } else {
                assert!(ct.starts_with("application/json"), "{ct}");
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
            };
            let last = chunks.last().cloned().unwrap_or(Value::Null);
            let finish = last["candidates"][0]["finishReason"].clone();
            assert_eq!(
                finish,
                if cut { "MAX_TOKENS" } else { "STOP" },
                "sse {sse}, cut {cut}: {last}"
            );
            assert!(
                last["usageMetadata"]["candidatesTokenCount"]
                    .as_u64()
                    .is_some(),
                "{last}"
            );
            assert!(chunks.iter().all(|c| c.get("error").is_none()), "{text}");
            gw.all_settled().await;
            let used = gw.t1_used(BudgetName::Tpm).await;
            if cut {
                assert!(chunks.len() < 600, "cut off before the upstream's end");
                assert!(
                    used <= prompt_estimate + 256 + 64 + 10,
                    "within the budget: {used}"
                );
            } else {
                assert_eq!(used, prompt_tokens(&b) + 20);
            }
        }
    }
}
