//! Estimation of Responses bodies against a corpus whose true counts the
//! test computes itself: its own tiktoken counts of every text plus the
//! framing docs/API.md documents (3 tokens per message + the role's
//! tokens, `instructions` as a developer message, a string `input` as a
//! user message, 3 to prime the reply; tools and schemas as the tokens of
//! their JSON; function calls as name + arguments + call id + 8). Text and
//! message bodies must be estimated within true + 2% + 8; tools, images
//! and structured output within true + the documented margin (10% of the
//! structured count + 32 once; images at the configured 1536 per image
//! against gpt-4o's high-detail worst case of 1445).

use budgetgate::dialects::Dialect;
use budgetgate::estimate::{estimate, Encoding, EstimateSettings, ModelEstimation};
use serde_json::{json, Value};

fn t(s: &str) -> u64 {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as u64
}

fn msg(role: &str, text: &str) -> u64 {
    3 + t(role) + t(text)
}

fn gateway_estimate(body: &Value) -> u64 {
    let me = ModelEstimation {
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

/// A body, its true count, and the structured part the margin applies to
/// (0 for plain text and messages).
struct Case {
    body: Value,
    truth: u64,
    structured: u64,
    images: u64,
}

fn text_case(body: Value, truth: u64) -> Case {
    Case {
        body,
        truth,
        structured: 0,
        images: 0,
    }
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
    // Structured: tools, schemas, calls, reasoning, images.
    let tool = json!({"type": "function", "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}});
    let tool2 = json!({"type": "function", "name": "lookup", "description": "Look up a word in the dictionary.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}, "strict": true});
    let j = |v: &Value| t(&v.to_string());
    let structured = |body: Value, text: u64, s: u64| Case {
        body,
        truth: text + s,
        structured: s,
        images: 0,
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
    let args = "{\"city\":\"Paris\",\"unit\":\"c\"}";
    c.push(structured(
        json!({"model": "m", "tools": [tool], "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
            {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\": 21, \"sky\": \"clear\"}"}]}),
        msg("user", "Weather in Paris?") + 3,
        j(&tool) + t("get_weather") + t(args) + t("call_1") + 8 + t("{\"temp\": 21, \"sky\": \"clear\"}") + t("call_1") + 8,
    ));
    c.push(structured(
        json!({"model": "m", "input": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Considered the options carefully."}], "encrypted_content": "gAAAAB..."},
            {"role": "user", "content": "Continue."}]}),
        msg("user", "Continue.") + 3,
        t("Considered the options carefully."),
    ));
    let image = |detail: &str| json!({"type": "input_image", "image_url": "https://example.com/a.png", "detail": detail});
    for (n, detail) in [(1, "low"), (1, "high"), (2, "auto")] {
        let parts: Vec<Value> =
            std::iter::once(json!({"type": "input_text", "text": "Describe these."}))
                .chain((0..n).map(|_| image(detail)))
                .collect();
        c.push(Case {
            body: json!({"model": "m", "input": [{"role": "user", "content": parts}]}),
            // gpt-4o's worst case per image (high detail, 8 tiles): 85 + 8 × 170.
            truth: 3 + t("user") + t("Describe these.") + 3 + n * 1445,
            structured: 0,
            images: n,
        });
    }
    c
}

#[test]
fn responses_estimates_stay_within_their_documented_bounds() {
    let corpus = corpus();
    assert!(corpus.len() >= 20, "{} bodies", corpus.len());
    let settings = EstimateSettings::default();
    for case in &corpus {
        let est = gateway_estimate(&case.body);
        assert!(
            est >= case.truth,
            "estimate {est} < true {} for {}",
            case.truth,
            case.body
        );
        let bound = if case.structured == 0 && case.images == 0 {
            case.truth + case.truth.div_ceil(50) + 8
        } else {
            let margin = case.structured * settings.structured_margin_percent / 100
                + 1
                + settings.structured_margin_tokens
                + case.images * (settings.image_part_tokens - 1445);
            case.truth + margin
        };
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
    for case in corpus()
        .iter()
        .filter(|c| c.structured == 0 && c.images == 0)
    {
        let mock =
            crate::support::mock_upstream::responses::responses_input_tokens(bpe, &case.body);
        assert_eq!(mock, case.truth, "{}", case.body);
    }
}
