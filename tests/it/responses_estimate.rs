//! Estimation of Responses bodies against a corpus whose true counts the
//! test computes itself, each from a published source:
//!
//! * messages: OpenAI's chat counting rule as docs/API.md frames it (3
//!   tokens per message + the role's tokens + the text's, `instructions` as
//!   a developer message, a string `input` as a user message, 3 to prime
//!   the reply);
//! * agent items (function calls, their outputs, reasoning passed back):
//!   the item rendered in OpenAI's published harmony format
//!   (github.com/openai/harmony) and counted with `o200k_harmony`, special
//!   tokens included: the provider's own count is not published, so this
//!   is the true count derived from the published rendering;
//! * images: the worst case of OpenAI's published image rule for the
//!   model and `detail` ("Images and vision" guide, "Calculating costs"):
//!   the gateway cannot see an image's size, so that is the most the
//!   provider can charge;
//! * tools and schemas: the tokens of their JSON (no published rule).
//!
//! Targets: every body within its true count + 2 % + 8
//! on the counted part, + 10 % + 32 on the structured part (tools,
//! `tool_choice`, schemas), and never below the true count.

use budgetgate::config::estimate::{Encoding, EstimateSettings};
use budgetgate::dialects::Dialect;
use budgetgate::estimate::{estimate, ModelEstimation};
use serde_json::{json, Value};

fn t(s: &str) -> u64 {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as u64
}

fn msg(role: &str, text: &str) -> u64 {
    3 + t(role) + t(text)
}

fn gateway_estimate(body: &Value) -> u64 {
    let model = body["model"].as_str().unwrap_or("m");
    let me = ModelEstimation {
        image: EstimateSettings::default().image_cost(model, model),
        encoding: Encoding::O200kBase,
        default_max_output_tokens: 100,
        max_output_tokens: Some(4096),
        min_output_tokens: 16,
        token_ratio: 1000,
    };
    estimate(
        Dialect::Responses,
        body,
        &me,
        &EstimateSettings::default(),
        budgetgate::estimate::TokenRoom::default(),
    )
    .unwrap_or_else(|e| panic!("{body}: {e}"))
    .input_tokens
}

/// A body, its true count, the structured part of it the margin applies
/// to, and whether it is plain text and messages (counted by the mock the
/// same way).
struct Case {
    body: Value,
    truth: u64,
    structured: u64,
    plain: bool,
}

fn text_case(body: Value, truth: u64) -> Case {
    Case {
        body,
        truth,
        structured: 0,
        plain: true,
    }
}

/// Tokens of `text` in the harmony format, special tokens included.
fn harmony(text: &str) -> u64 {
    tiktoken_rs::o200k_harmony_singleton()
        .encode_with_special_tokens(text)
        .len() as u64
}

fn h_call(name: &str, arguments: &str) -> u64 {
    harmony(&format!(
        "<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{arguments}<|call|>"
    ))
}

fn h_output(name: &str, output: &str) -> u64 {
    harmony(&format!(
        "<|start|>functions.{name} to=assistant<|channel|>commentary<|message|>{output}<|end|>"
    ))
}

fn h_reasoning(text: &str) -> u64 {
    harmony(&format!(
        "<|start|>assistant<|channel|>analysis<|message|>{text}<|end|>"
    ))
}

/// A call id as the API makes them (`call_` + 24 characters): ids are not
/// rendered, so they must not be charged.
fn call_id(i: usize) -> String {
    format!("call_{i}Xq7LmN2pRt9vWz4bYc8dKf3h")
}

fn corpus() -> Vec<Case> {
    let m = |input: Value| json!({"model": "gpt-4o-mini", "input": input});
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(200);
    let code = "fn main() {\n    let v: Vec<u64> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}\n";
    let mut c = vec![
        text_case(m(json!("Hello!")), msg("user", "Hello!") + 3),
        text_case(m(json!(long.clone())), msg("user", &long) + 3),
        text_case(
            json!({"model": "m", "instructions": "You are terse.", "input": "Why is the sky blue?"}),
            msg("developer", "You are terse.") + msg("user", "Why is the sky blue?") + 3,
        ),
        text_case(m(json!("Ünïcödé — 日本語のテキスト, emojis 🎉🚀")), msg("user", "Ünïcödé — 日本語のテキスト, emojis 🎉🚀") + 3),
        text_case(m(json!(code)), msg("user", code) + 3),
        text_case(m(json!("<|endoftext|> is ordinary text here")), msg("user", "<|endoftext|> is ordinary text here") + 3),
        text_case(
            m(json!([{"role": "user", "content": "First question?"}, {"role": "assistant", "content": "First answer."}, {"role": "user", "content": "Second?"}])),
            msg("user", "First question?") + msg("assistant", "First answer.") + msg("user", "Second?") + 3,
        ),
        text_case(
            m(json!([{"role": "developer", "content": "Rules."}, {"role": "user", "content": "Go."}])),
            msg("developer", "Rules.") + msg("user", "Go.") + 3,
        ),
        text_case(
            m(json!([{"role": "system", "content": "Be kind."}, {"type": "message", "role": "user", "content": "Hi"}])),
            msg("system", "Be kind.") + msg("user", "Hi") + 3,
        ),
        text_case(
            m(json!([{"role": "user", "content": [{"type": "input_text", "text": "Part one."}, {"type": "input_text", "text": " Part two."}]}])),
            3 + t("user") + t("Part one.") + t(" Part two.") + 3,
        ),
        text_case(
            m(json!([{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Earlier reply.", "annotations": []}]}, {"role": "user", "content": "More."}])),
            3 + t("assistant") + t("Earlier reply.") + msg("user", "More.") + 3,
        ),
        text_case(
            json!({"model": "m", "instructions": long, "input": [{"role": "user", "content": "Summarise."}]}),
            msg("developer", &long) + msg("user", "Summarise.") + 3,
        ),
        text_case(
            m(json!((0..30).map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("Turn number {i} of a long chat.")})).collect::<Vec<_>>())),
            (0..30).map(|i| msg(if i % 2 == 0 { "user" } else { "assistant" }, &format!("Turn number {i} of a long chat."))).sum::<u64>() + 3,
        ),
    ];
    // Structured: tools, schemas.
    let tool = json!({"type": "function", "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}});
    let tool2 = json!({"type": "function", "name": "lookup", "description": "Look up a word in the dictionary.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}, "strict": true});
    let j = |v: &Value| t(&v.to_string());
    let structured = |body: Value, text: u64, s: u64| Case {
        body,
        truth: text + s,
        structured: s,
        plain: false,
    };
    let agent = |body: Value, truth: u64| Case {
        body,
        truth,
        structured: 0,
        plain: false,
    };
    c.push(structured(
        json!({"model": "m", "input": "Weather in Paris?", "tools": [tool]}),
        msg("user", "Weather in Paris?") + 3,
        j(&tool),
    ));
    c.push(structured(
        json!({"model": "m", "input": "Weather and a word?", "tools": [tool, tool2]}),
        msg("user", "Weather and a word?") + 3,
        j(&tool) + j(&tool2),
    ));
    let tc = json!({"type": "function", "name": "get_weather"});
    c.push(structured(
        json!({"model": "m", "input": "Weather?", "tools": [tool], "tool_choice": tc}),
        msg("user", "Weather?") + 3,
        j(&tool) + j(&tc),
    ));
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "tags"], "additionalProperties": false});
    c.push(structured(
        json!({"model": "m", "input": "Extract the person.", "text": {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": true}}}),
        msg("user", "Extract the person.") + 3,
        j(&schema),
    ));

    // Tool loops: function_call + function_call_output items.
    let args = "{\"city\":\"Paris\",\"unit\":\"c\"}";
    let out = "{\"temp\": 21, \"sky\": \"clear\"}";
    c.push(structured(
        json!({"model": "m", "tools": [tool], "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call_id(1), "name": "get_weather", "arguments": args},
            {"type": "function_call_output", "call_id": call_id(1), "output": out}]}),
        msg("user", "Weather in Paris?") + h_call("get_weather", args) + h_output("get_weather", out) + 3,
        j(&tool),
    ));
    c.push(agent(
        json!({"model": "m", "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "id": "fc_1", "call_id": call_id(1), "name": "get_weather", "arguments": args, "status": "completed"},
            {"type": "function_call_output", "call_id": call_id(1), "output": out}]}),
        msg("user", "Weather in Paris?") + h_call("get_weather", args) + h_output("get_weather", out) + 3,
    ));
    // An agent's long loop: six calls of two tools, a long tool output.
    let page =
        "Search result: the Eiffel Tower is 330 metres tall and was completed in 1889. ".repeat(12);
    let mut items =
        vec![json!({"role": "user", "content": "Plan a day in Paris and check the weather."})];
    let mut truth = msg("user", "Plan a day in Paris and check the weather.");
    for i in 0..6 {
        let (name, a, o) = if i % 2 == 0 {
            (
                "get_weather",
                format!("{{\"city\":\"Paris\",\"day\":{i}}}"),
                out.to_string(),
            )
        } else {
            (
                "lookup",
                format!("{{\"q\":\"Paris sight {i}\"}}"),
                page.clone(),
            )
        };
        items.push(
            json!({"type": "function_call", "call_id": call_id(i), "name": name, "arguments": a}),
        );
        items.push(json!({"type": "function_call_output", "call_id": call_id(i), "output": o}));
        truth += h_call(name, &a) + h_output(name, &o);
    }
    items.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Here is your plan.", "annotations": []}]}));
    truth += msg("assistant", "Here is your plan.") + 3;
    c.push(structured(
        json!({"model": "m", "tools": [tool, tool2], "input": items}),
        truth,
        j(&tool) + j(&tool2),
    ));
    // The next turn of a stored conversation: only the output is sent (its
    // call is in the previous response), the name comes from `tools`.
    c.push(structured(
        json!({"model": "m", "previous_response_id": "resp_1", "tools": [tool], "input": [
            {"type": "function_call_output", "call_id": call_id(7), "output": out}]}),
        h_output("get_weather", out) + 3,
        j(&tool),
    ));
    // An output given as content parts.
    c.push(agent(
        json!({"model": "m", "input": [
            {"type": "function_call", "call_id": call_id(2), "name": "lookup", "arguments": "{\"q\":\"tower\"}"},
            {"type": "function_call_output", "call_id": call_id(2), "output": [{"type": "input_text", "text": page}]}]}),
        h_call("lookup", "{\"q\":\"tower\"}") + h_output("lookup", &page) + 3,
    ));

    // Reasoning items passed back.
    let summary = "**Weighing the options**\n\nThe user wants a day plan; I should check the weather first, then pick indoor sights if it rains.";
    c.push(agent(
        json!({"model": "o4-mini", "input": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Considered the options carefully."}], "encrypted_content": "gAAAAB..."},
            {"role": "user", "content": "Continue."}]}),
        h_reasoning("Considered the options carefully.") + msg("user", "Continue.") + 3,
    ));
    c.push(agent(
        json!({"model": "o4-mini", "input": [
            {"role": "user", "content": "Plan a day in Paris."},
            {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": summary}], "encrypted_content": "gAAAAABo-opaque-blob"},
            {"type": "function_call", "call_id": call_id(3), "name": "get_weather", "arguments": args},
            {"type": "function_call_output", "call_id": call_id(3), "output": out}]}),
        msg("user", "Plan a day in Paris.") + h_reasoning(summary) + h_call("get_weather", args) + h_output("get_weather", out) + 3,
    ));
    c.push(agent(
        json!({"model": "o3", "input": [
            {"type": "reasoning", "id": "rs_3", "summary": []},
            {"role": "user", "content": "Go on."}]}),
        h_reasoning("") + msg("user", "Go on.") + 3,
    ));

    // Images: the published worst case for the model and detail.
    let image = |detail: Option<&str>| match detail {
        Some(d) => {
            json!({"type": "input_image", "image_url": "https://example.com/a.png", "detail": d})
        }
        None => json!({"type": "input_image", "image_url": "https://example.com/a.png"}),
    };
    let images = [
        ("gpt-4o", 1, Some("low"), 85), // fixed low cost
        ("gpt-4.1", 2, Some("low"), 85),
        ("gpt-4o", 1, Some("high"), 1445), // 85 + 8 tiles × 170
        ("gpt-4o", 2, Some("auto"), 1445),
        ("gpt-4.1", 1, None, 1445),
        ("o3", 1, Some("high"), 1275), // 75 + 8 × 150
        ("o3", 1, Some("low"), 75),
        ("gpt-4o-mini", 1, Some("low"), 2833), // 4o-mini's own base
        ("gpt-4o-mini", 1, Some("high"), 48_169), // 2833 + 8 × 5667
        ("gpt-4.1-mini", 1, Some("low"), 2489), // ceil(1536 patches × 1.62), any detail
        ("gpt-4.1-nano", 1, Some("high"), 3779), // ceil(1536 × 2.46)
        ("o4-mini", 1, Some("auto"), 2642),    // ceil(1536 × 1.72)
    ];
    for (model, n, detail, each) in images {
        let parts: Vec<Value> =
            std::iter::once(json!({"type": "input_text", "text": "Describe these."}))
                .chain((0..n).map(|_| image(detail)))
                .collect();
        c.push(agent(
            json!({"model": model, "input": [{"role": "user", "content": parts}]}),
            3 + t("user") + t("Describe these.") + 3 + n * each,
        ));
    }
    c
}

#[test]
fn responses_estimates_stay_within_their_documented_bounds() {
    let corpus = corpus();
    assert!(corpus.len() >= 35, "{} bodies", corpus.len());
    for case in &corpus {
        let est = gateway_estimate(&case.body);
        // Shown with --nocapture: the figures behind the targets.
        eprintln!(
            "estimate {est:>6}  true {:>6}  structured {:>4}",
            case.truth, case.structured
        );
        assert!(
            est >= case.truth,
            "estimate {est} < true {} for {}",
            case.truth,
            case.body
        );
        // + 2 % + 8 on what is counted, + 10 % + 32 on the structured part.
        let counted = case.truth - case.structured;
        let mut bound = case.truth + counted.div_ceil(50) + 8;
        if case.structured > 0 {
            bound += case.structured.div_ceil(10) + 32;
        }
        assert!(
            est <= bound,
            "estimate {est} > bound {bound} (true {}) for {}",
            case.truth,
            case.body
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_upstream_counts_text_bodies_as_the_gateway_estimates_them() {
    // Cross-check with an independent implementation (the mock's own
    // counting, used for its reported usage) on the text bodies.
    let bpe = tiktoken_rs::o200k_base_singleton();
    for case in corpus().iter().filter(|c| c.plain) {
        let mock =
            crate::support::mock_upstream::responses::responses_input_tokens(bpe, &case.body);
        assert_eq!(mock, case.truth, "{}", case.body);
    }
}

#[test]
fn image_costs_load_per_model_and_can_be_configured_by_prefix() {
    use budgetgate::config::estimate::ImageCost;
    use budgetgate::config::{raw::RawImageTokens, Policy};
    // A prefix with its `low` and `high`.
    type Row<'a> = (&'a str, Option<i64>, Option<i64>);
    let load = |table: Option<Vec<Row>>| {
        let mut c = crate::support::TestConfig::standard(
            "http://127.0.0.1:9",
            50,
            crate::support::limits(),
        );
        c.estimation.image_tokens = table.map(|rows| {
            rows.into_iter()
                .map(|(p, low, high)| (p.to_owned(), RawImageTokens { low, high }))
                .collect()
        });
        Policy::from_toml(&c.render()).map_err(|e| e.to_string())
    };
    // The standard config serves gpt-4o-mini: its published rule.
    let p = load(None).expect("loads");
    let mini = p.model("gpt-4o-mini").expect("model").image;
    assert_eq!(
        mini,
        ImageCost {
            low: 2833,
            high: 48_169
        }
    );
    // A configured prefix wins over the published rule, case-insensitively;
    // `low` defaults to `high`.
    let p = load(Some(vec![
        ("GPT-4O", Some(90), Some(1500)),
        ("gpt-4o-mini", None, Some(3000)),
    ]))
    .expect("loads");
    assert_eq!(
        p.model("gpt-4o-mini").expect("model").image,
        ImageCost::flat(3000)
    );
    let e = load(Some(vec![("gpt-4o", Some(85), None)])).expect_err("no high");
    assert!(e.contains("estimation.image_tokens"), "{e}");
    let e = load(Some(vec![("gpt-4o", Some(0), Some(10))])).expect_err("zero low");
    assert!(e.contains("low"), "{e}");
}
