//! `GET /v1/models` for Claude Code's model discovery: every key header
//! of the other routes, Anthropic's shape (paginated) when the request
//! carries `anthropic-version` or `x-api-key`, OpenAI's otherwise; pattern
//! entries listed by their concrete `models`, never the pattern; unknown
//! and forbidden names one 404 in the request's shape.

use serde_json::{json, Value};

use crate::support::*;

/// The standard config, an Anthropic deployment serving `claude-*` (five
/// concrete names listed) and `claude-sonnet-4-5`; key `k2` of tenant
/// `t1` may use `claude-opus-*` only.
fn config(mock: &str) -> TestConfig {
    let mut c = TestConfig::standard(mock, 16, limits().tpm(1_000_000));
    c.upstreams
        .push(config::upstream("claude", Kind::Anthropic, mock));
    c.models.push(config::RawModel {
        models: [
            "claude-opus-5-5",
            "claude-opus-4-8",
            "claude-haiku-4-5",
            "claude-sonnet-5",
            "claude-sonnet-4-5",
        ]
        .map(String::from)
        .to_vec(),
        ..config::model("claude-*", &["claude"])
    });
    c.models
        .push(config::model("claude-sonnet-4-5", &["claude"]));
    c
}

/// A key of `t1` limited to `claude-opus-*`, made through the admin API
/// (only runtime keys carry model limits): its secret.
async fn opus_only_key(gw: &Gateway) -> String {
    gw.state.set_admin_token(Some("root-admin-token"));
    let (s, v) = admin_call(
        gw,
        reqwest::Method::POST,
        "/admin/v1/tenants/t1/keys",
        "root-admin-token",
        Some(json!({"id": "opus", "allowed_models": ["claude-opus-*"]})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    v["secret"].as_str().unwrap().to_string()
}

async fn get(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut r = reqwest::Client::new().get(format!("{}{path}", gw.base_url()));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await.expect("GET");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

fn ids(v: &Value) -> Vec<String> {
    v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_codes_discovery_gets_anthropics_shape_with_concrete_names_page_by_page() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url()).start().await;
    let anthropic = [("x-api-key", KEY), ("anthropic-version", "2023-06-01")];
    let (status, v) = get(&gw, "/models", &anthropic).await;
    assert_eq!(status, 200, "x-api-key is accepted: {v}");
    // The exact entry's name once (it resolves to itself, not the pattern).
    assert_eq!(
        ids(&v),
        [
            "claude-opus-5-5",
            "claude-opus-4-8",
            "claude-haiku-4-5",
            "claude-sonnet-5",
            "claude-sonnet-4-5"
        ],
        "Messages models only, never a pattern: {v}"
    );
    let first = &v["data"][0];
    assert_eq!(first["type"], "model");
    assert_eq!(first["display_name"], "claude-opus-5-5");
    let created = first["created_at"].as_str().unwrap();
    let b = created.as_bytes();
    assert!(
        b.len() == 20 && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[19] == b'Z',
        "RFC 3339 in UTC: {created}"
    );
    assert_eq!(v["has_more"], false);
    assert_eq!(v["first_id"], "claude-opus-5-5");
    assert_eq!(v["last_id"], "claude-sonnet-4-5");
    // Two at a time, forwards and back.
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let path = match after.is_empty() {
            true => "/models?limit=2".to_string(),
            false => format!("/models?limit=2&after_id={after}"),
        };
        let (status, page) = get(&gw, &path, &anthropic).await;
        assert_eq!(status, 200, "{page}");
        seen.extend(ids(&page));
        if page["has_more"] == false {
            break;
        }
        after = page["last_id"].as_str().unwrap().to_string();
    }
    assert_eq!(seen, ids(&v));
    let (_, back) = get(&gw, "/models?limit=2&before_id=claude-sonnet-5", &anthropic).await;
    assert_eq!(ids(&back), ["claude-opus-4-8", "claude-haiku-4-5"]);
    assert_eq!(back["has_more"], true);
    let (status, bad) = get(&gw, "/models?limit=0", &anthropic).await;
    assert_eq!(status, 400);
    assert_eq!(bad["type"], "error", "{bad}");
    // anthropic-version wins over a Bearer key; x-api-key alone is Anthropic's too.
    let bearer = format!("Bearer {KEY}");
    for headers in [
        vec![
            ("authorization", bearer.as_str()),
            ("anthropic-version", "2023-06-01"),
        ],
        vec![("x-api-key", KEY)],
    ] {
        let (status, v) = get(&gw, "/models", &headers).await;
        assert_eq!(status, 200);
        assert_eq!(v["data"][0]["type"], "model", "{headers:?}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openais_shape_without_anthropic_headers_and_one_404_for_unknown_and_forbidden() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url()).start().await;
    let bearer = format!("Bearer {KEY}");
    let (status, v) = get(&gw, "/models", &[("authorization", &bearer)]).await;
    assert_eq!(status, 200);
    assert_eq!(v["object"], "list");
    let names = ids(&v);
    assert!(names.contains(&"gpt-4o-mini".to_string()), "{names:?}");
    assert!(names.contains(&"claude-opus-5-5".to_string()), "{names:?}");
    assert!(
        names.iter().all(|n| !n.contains('*')),
        "no pattern listed: {names:?}"
    );
    // Azure's key header too.
    let (status, _) = get(&gw, "/models", &[("api-key", KEY)]).await;
    assert_eq!(status, 200);

    // A key limited to claude-opus-*: lists only those; a forbidden name
    // and an unknown one get the same 404, in the request's shape.
    let key2 = opus_only_key(&gw).await;
    let anthropic2 = [
        ("x-api-key", key2.as_str()),
        ("anthropic-version", "2023-06-01"),
    ];
    let (_, v) = get(&gw, "/models", &anthropic2).await;
    assert_eq!(ids(&v), ["claude-opus-5-5", "claude-opus-4-8"]);
    let (status, ok) = get(&gw, "/models/claude-opus-5-5", &anthropic2).await;
    assert_eq!(status, 200);
    assert_eq!(ok["id"], "claude-opus-5-5");
    assert_eq!(ok["type"], "model");
    let (s1, forbidden) = get(&gw, "/models/claude-sonnet-4-5", &anthropic2).await;
    let (s2, unknown) = get(&gw, "/models/claude-sonnet-4-5x", &anthropic2).await;
    assert_eq!((s1, s2), (404, 404));
    assert_eq!(forbidden["type"], "error", "Anthropic's shape: {forbidden}");
    assert_eq!(forbidden["error"]["type"], "not_found_error");
    let strip = |v: &Value, name: &str| {
        v["error"]["message"]
            .as_str()
            .unwrap()
            .replace(name, "NAME")
    };
    assert_eq!(
        strip(&forbidden, "claude-sonnet-4-5"),
        strip(&unknown, "claude-sonnet-4-5x"),
        "the same 404"
    );
    let bearer2 = format!("Bearer {key2}");
    let (status, v) = get(
        &gw,
        "/models/claude-sonnet-4-5",
        &[("authorization", &bearer2)],
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "model_not_found", "OpenAI's shape: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_list_models_parse() {
    let mock = start_mock().await;
    let gw = config(&mock.base_url()).start().await;
    let script = r#"
import json, sys
import anthropic, openai
base = sys.argv[1]
a = anthropic.Anthropic(base_url=base, api_key=sys.argv[2])
names = [m.id for m in a.models.list(limit=2)]
o = openai.OpenAI(base_url=base + "/v1", api_key=sys.argv[2])
print(json.dumps({"anthropic": names, "openai": [m.id for m in o.models.list()]}))
"#;
    let out = std::process::Command::new(crate::support::python::python())
        .arg("-c")
        .arg(script)
        .arg(gw.root_url())
        .arg(KEY)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        v["anthropic"],
        json!([
            "claude-opus-5-5",
            "claude-opus-4-8",
            "claude-haiku-4-5",
            "claude-sonnet-5",
            "claude-sonnet-4-5"
        ]),
        "the SDK paged through has_more"
    );
    assert!(v["openai"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| !n.as_str().unwrap().contains('*')));
}

/// The discovery request Claude Code 2.1.332 sends with
/// `CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY=1`, as recorded (path,
/// query and headers; docs/AGENTS.md, "Model discovery"), to the gateway
/// on `config/local-anthropic.toml`: Anthropic's shape, the shipped
/// concrete names, one page; with a Bearer token instead of the key, the
/// same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_codes_recorded_discovery_request_gets_anthropics_shape_on_the_shipped_config() {
    let mock = start_mock().await;
    let gw = crate::agents_cli::shipped("local-anthropic.toml", &mock)
        .start()
        .await;
    let common = [
        ("user-agent", "claude-code/2.1.332"),
        ("anthropic-version", "2023-06-01"),
        ("accept", "*/*"),
        ("accept-encoding", "gzip, deflate, br, zstd"),
    ];
    let bearer = format!("Bearer {}", "sk-local-claude");
    for key in [
        ("x-api-key", "sk-local-claude"),
        ("authorization", bearer.as_str()),
    ] {
        let mut headers = common.to_vec();
        headers.push(key);
        let (status, v) = get(&gw, "/models?limit=1000", &headers).await;
        assert_eq!(status, 200, "{key:?}: {v}");
        assert_eq!(
            ids(&v),
            [
                "claude-sonnet-4-5",
                "claude-opus-5-5",
                "claude-opus-4-8",
                "claude-haiku-4-5"
            ],
            "{key:?}: {v}"
        );
        assert!(v["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["type"] == "model"
                && m["display_name"].is_string()
                && m["created_at"].is_string()));
        assert_eq!(v["has_more"], false);
        assert_eq!(v["first_id"], "claude-sonnet-4-5");
        assert_eq!(v["last_id"], "claude-haiku-4-5");
    }
}
