//! Request spans over OTLP/HTTP (docs/OPERATIONS.md):
//! an OTLP receiver in the test (axum on a free loopback port) decodes the
//! protobuf the gateway posts to `/v1/traces` and finds one span per
//! request, with the GenAI semantic-convention attributes and the
//! gateway's own, and the same figures as the request's ledger row; a
//! refused request's span says why.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use serde_json::{json, Value};

use crate::support::*;

const TOKEN: &str = "telemetry-admin-token";

/// One received span: its name, kind, times and attributes as JSON values.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    kind: i32,
    start_ns: u64,
    end_ns: u64,
    error: bool,
    attributes: BTreeMap<String, Value>,
    service: Option<Value>,
}

fn values(kvs: &[KeyValue]) -> BTreeMap<String, Value> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::StringValue(s)) => json!(s),
                Some(Any::IntValue(i)) => json!(i),
                Some(Any::BoolValue(b)) => json!(b),
                Some(Any::DoubleValue(d)) => json!(d),
                _ => Value::Null,
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// An OTLP/HTTP traces receiver; the spans it was sent.
async fn receiver() -> (String, Arc<Mutex<Vec<Received>>>) {
    let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let kept = kept.clone();
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                for rs in req.resource_spans {
                    let resource = rs
                        .resource
                        .map(|r| values(&r.attributes))
                        .unwrap_or_default();
                    for ss in rs.scope_spans {
                        for s in ss.spans {
                            kept.lock().unwrap().push(Received {
                                name: s.name,
                                kind: s.kind,
                                start_ns: s.start_time_unix_nano,
                                end_ns: s.end_time_unix_nano,
                                error: s.status.is_some_and(|st| st.code == 2),
                                attributes: values(&s.attributes),
                                service: resource.get("service.name").cloned(),
                            });
                        }
                    }
                }
                // An empty ExportTraceServiceResponse.
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (format!("http://{addr}"), spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_one_otlp_span_with_genai_attributes_and_the_ledgers_figures() {
    let (endpoint, spans) = receiver().await;
    let mock = start_mock().await;
    mock.state.set_output_tokens(7);
    let mut c = TestConfig::standard(&mock.base_url(), 16, limits().usd_per_day("100"));
    c.upstream("mock").forward_client_headers = vec!["x-mock-fault".into()];
    c.model("gpt-4o-mini").price = Some(price("0.15", "0.60"));
    c.model("text-embedding-3-small").price = Some(price("0.02", "0"));
    c.telemetry.otlp_endpoint = Some(endpoint);
    c.telemetry.service_name = Some("gateway-under-test".into());
    c.telemetry.export_interval_ms = Some(100);
    c.ledger.batch_interval_ms = Some(100);
    let gw = c.start().await;
    gw.state.set_admin_token(Some(TOKEN));

    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    let calls: [(&str, Value, Option<&str>); 4] = [
        (
            "chat/completions",
            json!({"model": "gpt-4o-mini", "max_tokens": 9, "messages": [{"role": "user", "content": "one"}]}),
            None,
        ),
        (
            "chat/completions",
            json!({"model": "gpt-4o-mini", "max_tokens": 9, "stream": true, "messages": [{"role": "user", "content": "two"}]}),
            None,
        ),
        (
            "embeddings",
            json!({"model": "text-embedding-3-small", "input": "three"}),
            None,
        ),
        (
            "chat/completions",
            json!({"model": "gpt-4o-mini", "max_tokens": 9, "messages": [{"role": "user", "content": "four"}]}),
            Some("server_error"),
        ),
    ];
    for (path, body, fault) in &calls {
        let mut req = client
            .post(format!("{}/{path}", gw.base_url()))
            .bearer_auth(KEY)
            .json(body);
        if let Some(f) = fault {
            req = req.header("x-mock-fault", *f);
        }
        let r = req.send().await.unwrap();
        ids.push(header(&r, "x-request-id").expect("a request id"));
        let _ = r.bytes().await;
    }
    // A refused request (unknown key): no reservation, a span of its refusal.
    assert_eq!(post_hi(&gw, "sk-nobody").await, 401);
    gw.settled().await;

    let deadline = Instant::now() + Duration::from_secs(10);
    while spans.lock().unwrap().len() < calls.len() + 1 {
        assert!(
            Instant::now() < deadline,
            "spans received: {:?}",
            spans.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut got = spans.lock().unwrap().clone();
    assert_eq!(got.len(), calls.len() + 1, "one span per request: {got:?}");
    let refused = got
        .iter()
        .position(|s| s.attributes.get("budgetgate.outcome") == Some(&json!("refused")))
        .expect("the refusal's span");
    let refused = got.remove(refused);
    println!("span {:?}: {:?}", refused.name, refused.attributes);
    // Refused at authentication, before the body named a model.
    assert_eq!(refused.name, "chat");
    assert!(!refused.attributes.contains_key("gen_ai.request.model"));
    assert!(refused.error);
    assert_eq!(refused.attributes["budgetgate.error"], "invalid_key");
    assert_eq!(refused.attributes["http.response.status_code"], 401);
    assert!(
        !refused.attributes.contains_key("budgetgate.tenant"),
        "no tenant: the key is unknown"
    );
    assert!(!refused
        .attributes
        .contains_key("budgetgate.cost_usd_micros"));

    // The ledger's rows, the same figures.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = admin_get(&gw, "/admin/v1/spend/rows", Some(TOKEN)).await;
    let rows: Value = r.json().await.unwrap();
    let rows: BTreeMap<String, Value> = rows["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["reservation_id"].as_str().unwrap().to_string(), r.clone()))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let s = got
            .iter()
            .find(|s| s.attributes.get("budgetgate.reservation_id") == Some(&json!(id)))
            .unwrap_or_else(|| panic!("no span of request {id}: {got:?}"));
        let row = &rows[id];
        let a = &s.attributes;
        println!("span {:?}: {a:?}", s.name);
        let operation = if i == 2 { "embeddings" } else { "chat" };
        let model = row["model"].as_str().unwrap();
        assert_eq!(s.name, format!("{operation} {model}"));
        assert_eq!(s.kind, 2, "SPAN_KIND_SERVER");
        assert_eq!(s.service, Some(json!("gateway-under-test")));
        assert!(s.start_ns > 0 && s.start_ns <= s.end_ns, "{s:?}");
        assert_eq!(a["gen_ai.operation.name"], operation);
        assert_eq!(a["gen_ai.provider.name"], "self_hosted");
        assert_eq!(a["gen_ai.system"], "self_hosted");
        assert_eq!(a["gen_ai.request.model"], model);
        assert_eq!(
            a["gen_ai.response.model"], model,
            "the mock's upstream model name"
        );
        let input = row["input_tokens"].as_u64().unwrap()
            + row["cached_read_tokens"].as_u64().unwrap()
            + row["cache_write_tokens"].as_u64().unwrap();
        assert_eq!(a["gen_ai.usage.input_tokens"], json!(input));
        assert_eq!(a["gen_ai.usage.output_tokens"], row["output_tokens"]);
        assert_eq!(a["budgetgate.cost_usd_micros"], row["cost_micros"]);
        assert_eq!(a["budgetgate.tenant"], "t1");
        assert_eq!(a["budgetgate.key"], "k1");
        assert_eq!(a["budgetgate.outcome"], row["outcome"]);
        assert_eq!(a["budgetgate.deployment"], "mock");
        assert_eq!(s.error, row["outcome"] == "upstream_failed", "{s:?}");
    }
    let answered = &got
        .iter()
        .find(|s| s.attributes["budgetgate.reservation_id"] == json!(ids[0]))
        .unwrap()
        .attributes;
    assert_eq!(answered["gen_ai.usage.output_tokens"], 7);
    assert!(answered["gen_ai.usage.input_tokens"].as_i64().unwrap() > 0);
    assert!(answered["budgetgate.cost_usd_micros"].as_i64().unwrap() > 0);
    let failed = &got
        .iter()
        .find(|s| s.attributes["budgetgate.reservation_id"] == json!(ids[3]))
        .unwrap()
        .attributes;
    assert_eq!(failed["budgetgate.outcome"], "upstream_failed");
    assert_eq!(failed["budgetgate.cost_usd_micros"], 0);
}
