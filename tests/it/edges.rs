//! The edges: streams at the request's time limit and at the
//! cap the gateway sent end with the dialect's clean cutoff (parsed by the
//! official Python SDK without an exception) and settle what was
//! delivered; a client that asked for usage gets the gateway's count when
//! the upstream sends none; a whole answer over its cap settles as debt
//! and is counted.
use std::time::{Duration, Instant};

use crate::support::mock_upstream::Fault;
use crate::support::*;
use budgetgate::budget::BudgetName;
use serde_json::{json, Value};

/// One deployment `mock` of `kind`, model `gpt-4o-mini` with `max_output`,
/// tenant t1 with a large daily quota (to read what was settled).
fn edge_config(upstream: &str, kind: Kind, max_output: u64) -> TestConfig {
    named_config(upstream, "mock", kind, max_output)
}

/// [`edge_config`] with the deployment named `name` (metrics are global to
/// the test process: each metric test has its own deployment).
fn named_config(upstream: &str, name: &str, kind: Kind, max_output: u64) -> TestConfig {
    let mut config = TestConfig::standard(upstream, 32, limits().tokens_per_day(10000000));
    config.estimation.stream_extension_step = Some(64);
    config.model("gpt-4o-mini").max_output_tokens = Some(max_output as i64);
    config.upstream("mock").kind = Some(kind.name().into());
    config.rename_upstream("mock", name);
    config
}

fn messages() -> Value {
    json!([{"role": "user", "content": "Tell a very long story."}])
}

fn input_tokens() -> u64 {
    chat_input_tokens(&json!({"model": "gpt-4o-mini", "messages": messages()}))
}

async fn over_cap_count(gw: &Gateway, deployment: &str, response: &str) -> f64 {
    let scrape = scrape(gw).await;
    sample_sum(
        &scrape,
        "budgetgate_output_over_cap_total",
        &[("deployment", deployment), ("response", response)],
    )
}

// ---------------------------------------------------------------------------
// Finding 1: the request's time limit
// ---------------------------------------------------------------------------

async fn time_limit_case(client_usage: bool) {
    let mock = start_mock().await;
    mock.state.set_output_tokens(1000);
    mock.state.set_token_delay(Duration::from_millis(20));
    let gw = {
        let mut config = edge_config(&mock.base_url(), Kind::SelfHosted, 4096);
        config.server.max_request_secs = Some(2);
        config
    }
    .start()
    .await;
    let mut kwargs = json!({"model": "gpt-4o-mini", "messages": messages()});
    if client_usage {
        kwargs["stream_options"] = json!({"include_usage": true});
    }
    let started = Instant::now();
    let r = sdk_stream(&gw, &kwargs).await;
    let took = started.elapsed();
    assert!(
        r["error"].is_null(),
        "the SDK parsed the time-limit cutoff without an exception: {r}"
    );
    assert_eq!(r["finish"]["0"], "length", "clean cutoff: {r}");
    let delivered = deltas(&r, "0");
    // 20 ms per token: about 100 tokens in the 2 s the request may take.
    assert!(
        delivered > 10 && delivered < 150,
        "ended at the 2 s limit: {delivered} tokens in {took:?}"
    );
    if client_usage {
        assert_eq!(r["usage_chunks"], 1, "{r}");
        assert_eq!(r["usage"]["completion_tokens"], delivered, "{r}");
    } else {
        assert_eq!(r["usage_chunks"], 0, "{r}");
    }
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input_tokens() + delivered,
        "settled what was delivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_at_max_request_secs_ends_with_the_clean_cutoff() {
    time_limit_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_at_max_request_secs_ends_with_the_clean_cutoff_and_usage_when_asked() {
    time_limit_case(true).await;
}

// ---------------------------------------------------------------------------
// Finding 5: usage for clients that asked
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_asked_for_usage_gets_the_gateways_count_when_the_upstream_sends_none() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(40);
    mock.state.set_fault(Some(Fault::MissingUsage));
    let gw = edge_config(&mock.base_url(), Kind::SelfHosted, 4096)
        .start()
        .await;
    let r = sdk_stream(
        &gw,
        &json!({"model": "gpt-4o-mini", "messages": messages(),
                "stream_options": {"include_usage": true}}),
    )
    .await;
    assert!(r["error"].is_null(), "{r}");
    assert_eq!(r["finish"]["0"], "stop", "{r}");
    assert_eq!(r["usage_chunks"], 1, "one usage chunk, the gateway's: {r}");
    assert_eq!(r["usage"]["completion_tokens"], 40, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], input_tokens(), "{r}");
    assert_eq!(r["usage"]["total_tokens"], input_tokens() + 40, "{r}");
    // A client that did not ask still gets none.
    let r = sdk_stream(
        &gw,
        &json!({"model": "gpt-4o-mini", "messages": messages()}),
    )
    .await;
    assert_eq!(r["usage_chunks"], 0, "{r}");
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        2 * (input_tokens() + 40)
    );
}

// ---------------------------------------------------------------------------
// Finding 6: the cap we send is the cap we enforce
// ---------------------------------------------------------------------------

/// An upstream that reads only `max_tokens` (llama.cpp's server) gets
/// `max_completion_tokens` and streams past it.
async fn over_cap_case(
    name: &str,
    kind: Kind,
    client_cap: Option<u64>,
    model_max: u64,
) -> (Value, Gateway) {
    let mock = start_mock().await;
    mock.state.set_output_tokens(400);
    mock.state.set_fault(Some(Fault::MaxTokensOnly));
    let gw = named_config(&mock.base_url(), name, kind, model_max)
        .start()
        .await;
    let mut kwargs = json!({"model": "gpt-4o-mini", "messages": messages(),
                            "stream_options": {"include_usage": true}});
    if let Some(cap) = client_cap {
        kwargs["max_completion_tokens"] = json!(cap);
    }
    let r = sdk_stream(&gw, &kwargs).await;
    assert!(
        r["error"].is_null(),
        "the SDK parsed the stream without an exception: {r}"
    );
    gw.all_settled().await;
    let sent = &mock.state.requests()[0].body;
    assert!(
        sent.get("max_tokens").is_none(),
        "the cap went as max_completion_tokens"
    );
    (r, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_hosted_stream_past_the_client_cap_is_cut_off_at_cap_plus_tolerance() {
    let (r, gw) = over_cap_case("capped", Kind::SelfHosted, Some(100), 4096).await;
    // Tolerance max(2 % of 100, one delta of 1 token) = 2.
    assert_eq!(deltas(&r, "0"), 102, "cut off at cap + tolerance: {r}");
    assert_eq!(r["finish"]["0"], "length", "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 102, "{r}");
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input_tokens() + 102
    );
    assert_eq!(over_cap_count(&gw, "capped", "stream_cut_off").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_hosted_uncapped_stream_is_cut_off_at_the_models_maximum() {
    let (r, gw) = over_cap_case("uncapped", Kind::SelfHosted, None, 200).await;
    // Sent uncapped, enforced at the model's 200; tolerance 4.
    assert_eq!(deltas(&r, "0"), 204, "{r}");
    assert_eq!(r["finish"]["0"], "length", "{r}");
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input_tokens() + 204
    );
    assert_eq!(over_cap_count(&gw, "uncapped", "stream_cut_off").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_streams_are_never_cut_before_the_upstreams_finish() {
    let (r, gw) = over_cap_case("trusted", Kind::Openai, Some(100), 4096).await;
    assert_eq!(deltas(&r, "0"), 400, "{r}");
    assert_eq!(r["finish"]["0"], "stop", "{r}");
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        input_tokens() + 400,
        "the excess is debt"
    );
    assert_eq!(over_cap_count(&gw, "trusted", "stream_cut_off").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_answer_over_the_cap_settles_as_debt_and_is_counted() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(120);
    mock.state.set_fault(Some(Fault::MaxTokensOnly));
    let gw = named_config(&mock.base_url(), "debtor", Kind::SelfHosted, 4096)
        .start()
        .await;
    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini", "messages": messages(), "max_completion_tokens": 50}))
        .send()
        .await
        .expect("gateway");
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["usage"]["completion_tokens"], 120);
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        body["usage"]["total_tokens"].as_u64().unwrap()
    );
    assert_eq!(over_cap_count(&gw, "debtor", "answer_debt").await, 1.0);
}

// ---------------------------------------------------------------------------
// Finding 3: credentials are never forwarded
// ---------------------------------------------------------------------------

/// A config whose deployment forwards `forward`, of which `credentials`
/// are listed as credentials.
fn forwarding_config(upstream: &str, forward: &[&str], credentials: &[&str]) -> TestConfig {
    let mut config = edge_config(upstream, Kind::SelfHosted, 4096);
    let up = config.upstream("mock");
    up.forward_client_headers = forward.iter().map(|h| h.to_string()).collect();
    up.forward_credential_headers = credentials.iter().map(|h| h.to_string()).collect();
    config
}

fn load_error(toml: &str) -> String {
    match budgetgate::config::Policy::from_toml(toml) {
        Ok(_) => panic!("config accepted: {toml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn credential_headers_are_refused_at_load_unless_listed_as_credentials() {
    let base = "http://127.0.0.1:9";
    for h in [
        "x-api-key",
        "X-Goog-Api-Key",
        "ocp-apim-subscription-key",
        "x-amz-security-token",
        "proxy-authorization",
        "cookie",
        "x-custom-token",
        "x-vendor-secret",
        "x-partner-key",
    ] {
        let e = load_error(&forwarding_config(base, &[h], &[]).render());
        assert!(
            e.contains(&format!("{:?}", h.to_ascii_lowercase())),
            "names the header: {e}"
        );
        assert!(
            e.contains("forward_credential_headers"),
            "names the explicit list: {e}"
        );
        // Named in the explicit list too, it is accepted.
        budgetgate::config::Policy::from_toml(&forwarding_config(base, &[h], &[h]).render())
            .unwrap_or_else(|e| panic!("{h} in both lists: {e}"));
    }
    // The key's own headers and the gateway's are refused in either list.
    for h in [
        "authorization",
        "Api-Key",
        "x-request-id",
        "host",
        "content-encoding",
    ] {
        let e = load_error(&forwarding_config(base, &[h], &[h]).render());
        assert!(e.contains("cannot be forwarded"), "{h}: {e}");
    }
    // A credential list entry that is not forwarded is a mistake.
    let e = load_error(&forwarding_config(base, &[], &["x-api-key"]).render());
    assert!(e.contains("not in"), "{e}");
    // Ordinary headers pass.
    budgetgate::config::Policy::from_toml(
        &forwarding_config(base, &["openai-organization", "OpenAI-Project"], &[]).render(),
    )
    .expect("ordinary headers");
}

#[test]
fn check_config_names_the_credential_header_and_the_explicit_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("forward.toml");
    std::fs::write(
        &path,
        forwarding_config("http://127.0.0.1:9", &["x-api-key"], &[]).render(),
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_budgetgate"))
        .arg("check-config")
        .arg(&path)
        .output()
        .expect("run budgetgate");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "check-config failed: {all}");
    assert!(all.contains("\"x-api-key\""), "{all}");
    assert!(all.contains("forward_credential_headers"), "{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_credential_reaches_the_upstream_on_any_route() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(4);
    let gw = forwarding_config(
        &mock.base_url(),
        &["openai-organization", "x-api-key"],
        &["x-api-key"],
    )
    .start()
    .await;
    let client = reqwest::Client::new();
    let chat = json!({"model": "gpt-4o-mini", "messages": messages()});
    let stream = json!({"model": "gpt-4o-mini", "messages": messages(), "stream": true});
    let completion = json!({"model": "gpt-4o-mini", "prompt": "Say hi"});
    let embedding = json!({"model": "text-embedding-3-small", "input": "hi"});
    let root = gw.root_url();
    let routes = [
        ("/v1/chat/completions", &chat),
        ("/v1/chat/completions", &stream),
        ("/v1/completions", &completion),
        ("/v1/embeddings", &embedding),
        ("/openai/deployments/gpt-4o-mini/chat/completions", &chat),
        ("/openai/deployments/gpt-4o-mini/completions", &completion),
        (
            "/openai/deployments/text-embedding-3-small/embeddings",
            &embedding,
        ),
    ];
    // The key as Bearer, as `api-key`, and sent again as `x-api-key`
    // (forwardable by config, but never when it holds the gateway key).
    for (path, body) in routes {
        for auth in ["bearer", "api-key"] {
            let mut req = client
                .post(format!("{root}{path}"))
                .header("openai-organization", "org-1")
                .header("x-api-key", KEY)
                .json(body);
            req = if auth == "bearer" {
                req.bearer_auth(KEY)
            } else {
                req.header("api-key", KEY)
            };
            let resp = req.send().await.expect("gateway");
            assert_eq!(resp.status(), 200, "{path} ({auth})");
            resp.bytes().await.expect("body");
        }
    }
    // A different x-api-key (a credential of another service, explicitly allowed) is forwarded.
    let resp = client
        .post(format!("{root}/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-api-key", "partner-credential")
        .json(&chat)
        .send()
        .await
        .expect("gateway");
    assert_eq!(resp.status(), 200);
    let log = mock.state.requests();
    assert_eq!(log.len(), 2 * routes.len() + 1);
    assert_no_header_holds(&log, KEY);
    for r in &log {
        for (name, _) in &r.headers {
            assert!(name != "api-key", "{}: no api-key upstream", r.path);
        }
    }
    for r in &log[..log.len() - 1] {
        assert_eq!(r.header("openai-organization"), Some("org-1"), "{}", r.path);
    }
    assert_eq!(
        log.last().unwrap().header("x-api-key"),
        Some("partner-credential")
    );
    assert!(log[0].header("x-api-key").is_none());
}

// ---------------------------------------------------------------------------
// Finding 2: both header families on every refusal
// ---------------------------------------------------------------------------

fn limits_config(upstream: &str, tenant_limits: Limits) -> TestConfig {
    let mut config = edge_config(upstream, Kind::SelfHosted, 4096);
    config.tenant("t1").limits = tenant_limits;
    config
}

async fn chat_status(gw: &Gateway, max_tokens: u64) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-4o-mini", "messages": messages(), "max_tokens": max_tokens}))
        .send()
        .await
        .expect("gateway")
}

/// Asserts a 429 carries both `x-ratelimit-*` families and IETF members
/// for the tenant's RPM and TPM; returns the response's headers.
fn assert_both_families(resp: &reqwest::Response, rpm: u64, tpm: u64, what: &str) {
    assert_eq!(resp.status(), 429, "{what}");
    let h = resp.headers();
    let get = |n: &str| {
        h.get(n)
            .unwrap_or_else(|| panic!("{what}: no {n} header: {h:?}"))
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(get("x-ratelimit-limit-requests"), rpm.to_string(), "{what}");
    assert_eq!(get("x-ratelimit-limit-tokens"), tpm.to_string(), "{what}");
    for n in [
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
    ] {
        get(n);
    }
    let policy = get("ratelimit-policy");
    assert!(
        policy.contains(&format!("\"tenant-rpm\";q={rpm};w=60")),
        "{what}: {policy}"
    );
    assert!(
        policy.contains(&format!("\"tenant-tpm\";q={tpm};w=60")),
        "{what}: {policy}"
    );
    let values = get("ratelimit");
    assert!(
        values.contains("\"tenant-rpm\";r=") && values.contains("\"tenant-tpm\";r="),
        "{what}: {values}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_refusals_carry_the_request_family_too_and_deny_cache_refusals_only_their_own() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(600);
    let gw = limits_config(&mock.base_url(), limits().tpm(1000).rpm(100))
        .start()
        .await;
    let first = chat_status(&gw, 600).await;
    assert_eq!(first.status(), 200);
    first.bytes().await.unwrap();
    gw.all_settled().await;
    // About 620 of 1000 tokens spent: another 600 does not fit (the store refuses).
    let refused = chat_status(&gw, 600).await;
    assert_both_families(&refused, 100, 1000, "TPM refusal from the store");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "tokens", "{body}");
    // The same again is refused by the deny cache: its own family only.
    let cached = chat_status(&gw, 600).await;
    assert_eq!(cached.status(), 429);
    let h = cached.headers();
    assert_eq!(h["x-ratelimit-limit-tokens"], "1000");
    assert!(h.get("x-ratelimit-limit-requests").is_none(), "{h:?}");
    assert_eq!(mock.state.request_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_refusals_carry_the_token_family_too() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5);
    let gw = limits_config(&mock.base_url(), limits().tpm(50000).rpm(1))
        .start()
        .await;
    let first = chat_status(&gw, 10).await;
    assert_eq!(first.status(), 200);
    first.bytes().await.unwrap();
    let refused = chat_status(&gw, 10).await;
    assert_both_families(&refused, 1, 50000, "RPM refusal");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "requests", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_and_concurrency_refusals_carry_both_families() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(5);
    let gw = limits_config(
        &mock.base_url(),
        limits().tpm(1000).rpm(100).max_concurrent(1),
    )
    .start()
    .await;
    // Larger than the TPM capacity: impossible.
    let refused = chat_status(&gw, 2000).await;
    assert_both_families(&refused, 100, 1000, "impossible refusal");
    assert_eq!(refused.headers()["x-should-retry"], "false");
    // One request held upstream; a second finds no slot.
    mock.state.hold();
    let held = {
        let gw_url = gw.base_url();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{gw_url}/chat/completions"))
                .bearer_auth(KEY)
                .json(&json!({"model": "gpt-4o-mini", "messages": messages(), "max_tokens": 5}))
                .send()
                .await
                .map(|r| r.status())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while mock.state.held_count() == 0 {
        assert!(Instant::now() < deadline, "the first request never arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = chat_status(&gw, 5).await;
    assert_both_families(&refused, 100, 1000, "concurrency refusal");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "concurrency", "{body}");
    mock.state.release();
    assert_eq!(held.await.unwrap().unwrap(), 200);
}

// ---------------------------------------------------------------------------
// Finding 4: compressed request bodies
// ---------------------------------------------------------------------------

/// `n` pseudo-random lower-case letters (xorshift): gzip makes them about
/// 60 % of their size.
fn letters(n: usize, mut seed: u64) -> String {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (b'a' + (seed % 26) as u8) as char
        })
        .collect()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zlib(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

async fn post_encoded(gw: &Gateway, encoding: &str, body: Vec<u8>) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/chat/completions", gw.base_url()))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .header("content-encoding", encoding)
        .body(body)
        .send()
        .await
        .expect("gateway")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_bodies_are_capped_decoded_answered_and_estimated_on_the_decoded_bytes() {
    let mock = start_mock().await;
    mock.state.set_output_tokens(3);
    // No upstream usage: the settlement is the gateway's estimate of the
    // prompt plus its count of the output.
    mock.state.set_fault(Some(Fault::MissingUsage));
    let gw = {
        let mut config = edge_config(&mock.base_url(), Kind::SelfHosted, 4096);
        config.server.max_body_bytes = Some(4194304);
        config
    }
    .start()
    .await;

    // 3 MB of gzip that decodes to 5 MB: over the 4 MiB cap once decoded.
    let big = json!({"model": "gpt-4o-mini",
                     "messages": [{"role": "user", "content": letters(5_000_000, 7)}]});
    let packed = gzip(big.to_string().as_bytes());
    assert!(
        (2_500_000..4_194_304).contains(&packed.len()),
        "about 3 MB compressed: {}",
        packed.len()
    );
    let resp = post_encoded(&gw, "gzip", packed).await;
    assert_eq!(resp.status(), 413);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "request_too_large", "{body}");
    assert_eq!(mock.state.request_count(), 0);

    // One that decodes to 1 MB is answered and estimated on the decoded bytes.
    let text = letters(1_000_000, 11);
    let small = json!({"model": "gpt-4o-mini",
                       "messages": [{"role": "user", "content": text}], "max_tokens": 3});
    let resp = post_encoded(&gw, "GZip", gzip(small.to_string().as_bytes())).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    gw.all_settled().await;
    assert_eq!(
        gw.t1_used(BudgetName::TokensPerDay).await,
        chat_input_tokens(&small) + 3
    );
    let sent = &mock.state.requests()[0];
    assert!(sent.header("content-encoding").is_none());
    assert_eq!(sent.body["messages"][0]["content"], text.as_str());

    // deflate (zlib) too.
    let resp = post_encoded(&gw, "deflate", zlib(small.to_string().as_bytes())).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_stacked_and_corrupt_encodings_get_the_dialects_error_body() {
    let mock = start_mock().await;
    let gw = edge_config(&mock.base_url(), Kind::SelfHosted, 4096)
        .start()
        .await;
    let plain = json!({"model": "gpt-4o-mini", "messages": messages()}).to_string();
    for (encoding, body, status, code) in [
        (
            "compress",
            plain.clone().into_bytes(),
            415,
            "unsupported_content_encoding",
        ),
        (
            "gzip, gzip",
            gzip(&gzip(plain.as_bytes())),
            415,
            "unsupported_content_encoding",
        ),
        ("gzip", b"not gzip at all".to_vec(), 400, ""),
    ] {
        let resp = post_encoded(&gw, encoding, body).await;
        assert_eq!(resp.status(), status, "{encoding}");
        let body: Value = resp.json().await.expect("a JSON error body");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        if !code.is_empty() {
            assert_eq!(body["error"]["code"], code, "{body}");
        }
    }
    assert_eq!(mock.state.request_count(), 0);
}
