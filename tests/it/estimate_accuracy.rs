//! Accuracy of the chat input estimate against OpenAI's published counting
//! rule (DESIGN §4).
//!
//! The reference count is computed here, independently of the estimator,
//! from OpenAI Cookbook, "How to count tokens with tiktoken",
//! `num_tokens_from_messages`
//! (<https://cookbook.openai.com/examples/how_to_count_tokens_with_tiktoken>):
//!
//! ```text
//! tokens_per_message = 3; tokens_per_name = 1
//! for message in messages:
//!     num_tokens += tokens_per_message
//!     for key, value in message.items():
//!         num_tokens += len(encoding.encode(value))
//!         if key == "name": num_tokens += tokens_per_name
//! num_tokens += 3  # every reply is primed with <|start|>assistant<|message|>
//! ```
//!
//! String counts use tiktoken-rs directly (`encode_ordinary`, so text like
//! `<|endoftext|>` is ordinary text, as the gateway must treat client text).

use budgetgate::config::estimate::{Encoding, EstimateSettings};
use budgetgate::dialects::Dialect;
use budgetgate::estimate::{estimate, ModelEstimation};
use serde_json::{json, Value};
use tiktoken_rs::CoreBPE;

/// A message as ordered `(key, value)` string pairs.
type Msg = Vec<(&'static str, String)>;

fn m(role: &'static str, content: &str) -> Msg {
    vec![("role", role.to_owned()), ("content", content.to_owned())]
}

fn named(role: &'static str, name: &str, content: &str) -> Msg {
    vec![
        ("role", role.to_owned()),
        ("name", name.to_owned()),
        ("content", content.to_owned()),
    ]
}

fn bpe(enc: Encoding) -> &'static CoreBPE {
    match enc {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
    }
}

fn tokens(enc: Encoding, s: &str) -> u64 {
    bpe(enc).encode_ordinary(s).len() as u64
}

/// `num_tokens_from_messages` of the Cookbook (see the module docs), with
/// `enc`'s counts.
fn rule_count(enc: Encoding, messages: &[Msg]) -> u64 {
    crate::support::rule_count(&to_json(messages), |s| tokens(enc, s))
}

fn to_json(messages: &[Msg]) -> Value {
    Value::Array(
        messages
            .iter()
            .map(|msg| {
                let obj: serde_json::Map<String, Value> = msg
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Value::String(v.clone())))
                    .collect();
                Value::Object(obj)
            })
            .collect(),
    )
}

fn model(enc: Encoding) -> ModelEstimation {
    ModelEstimation {
        encoding: enc,
        default_max_output_tokens: 1024,
        max_output_tokens: Some(16384),
        min_output_tokens: 16,
        token_ratio: 1000,
        image: budgetgate::config::estimate::ImageCost::flat(1536),
    }
}

fn estimate_input(enc: Encoding, body: &Value) -> u64 {
    estimate(
        Dialect::ChatCompletions,
        body,
        &model(enc),
        &EstimateSettings::default(),
        budgetgate::estimate::TokenRoom::default(),
    )
    .expect("valid body")
    .input_tokens
}

const ENCODINGS: [Encoding; 2] = [Encoding::O200kBase, Encoding::Cl100kBase];

fn long_text() -> String {
    let para = "The quick brown fox jumps over the lazy dog. Budgets are reserved before \
                the request is forwarded and settled afterwards; unused output is refunded. ";
    para.repeat(60)
}

/// Several conversations, ≥ 50 messages in all: system / developer / user /
/// assistant / tool turns, `name` fields, unicode (CJK, emoji, accents, RTL),
/// code blocks, JSON, long and short, empty strings, special-token text.
fn corpus() -> Vec<(&'static str, Vec<Msg>)> {
    let long = long_text();
    vec![
        (
            "support chat",
            vec![
                m("system", "You are a helpful customer-support assistant for Acme Corp."),
                m("user", "Hi! My order #12345 hasn't arrived yet."),
                m("assistant", "I'm sorry to hear that. Could you confirm the shipping address?"),
                m("user", "221B Baker Street, London NW1 6XE"),
                m("assistant", "Thanks. The parcel left our warehouse on 3 March and is in transit."),
                m("user", "ok"),
                m("assistant", "Is there anything else I can help with?"),
                m("user", "no thanks 👍"),
            ],
        ),
        (
            "named participants",
            vec![
                named("system", "example_user", "New synergies will help drive top-line growth."),
                named("system", "example_assistant", "Things working well together will increase revenue."),
                named("user", "alice", "Can we circle back on the deliverables?"),
                named("user", "bob_the_builder-42", "Let's take this offline."),
                named("assistant", "helper", "Understood."),
                named("user", "Ωmega", "naming with unicode"),
                named("user", "x", ""),
            ],
        ),
        (
            "multilingual unicode",
            vec![
                m("system", "Réponds dans la langue de l'utilisateur."),
                m("user", "日本語で東京の天気を教えてください。"),
                m("assistant", "東京は今日は晴れで、最高気温は25度です。"),
                m("user", "你好，世界！这是一个测试。"),
                m("assistant", "안녕하세요! 무엇을 도와드릴까요?"),
                m("user", "Ça va? Crème brûlée, naïve façade, Zürich, São Paulo, Ærøskøbing."),
                m("assistant", "مرحبا بالعالم — שלום עולם"),
                m("user", "🎉🚀🔥 emoji only 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷"),
                m("assistant", "Здравствуйте! Ελληνικά: καλημέρα. हिन्दी: नमस्ते।"),
                m("user", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 ∑∫√∞ ≠ ≤ ≥"),
            ],
        ),
        (
            "code and json",
            vec![
                m("system", "You are an expert Rust and Python reviewer."),
                m(
                    "user",
                    "Review this:\n```rust\nfn main() {\n    let v: Vec<u64> = (0..10).collect();\n    println!(\"{:?}\", v.iter().sum::<u64>());\n}\n```",
                ),
                m(
                    "assistant",
                    "Looks fine. A shorter form:\n```rust\nprintln!(\"{}\", (0..10u64).sum::<u64>());\n```",
                ),
                m(
                    "user",
                    "```python\ndef fib(n):\n\treturn n if n < 2 else fib(n-1) + fib(n-2)\n```\nIs this slow?",
                ),
                m("assistant", "Yes, exponential. Use `functools.lru_cache` or iterate."),
                m(
                    "user",
                    r#"{"id": 1, "tags": ["a", "b"], "nested": {"ok": true, "ratio": 0.75, "none": null}}"#,
                ),
                m("assistant", r#"[{"k":"v"},{"k":"w\n\"quoted\""}]"#),
                m("user", "SELECT id, name FROM users WHERE created_at > NOW() - INTERVAL '7 days';"),
                m("assistant", "<html><body><div class=\"x\">&amp; &lt;tag&gt;</div></body></html>"),
                m("user", "    indented\n\n\n\ttabs\r\nwindows line endings\r\n"),
            ],
        ),
        (
            "long and short",
            vec![
                m("system", ""),
                m("user", ""),
                m("assistant", "a"),
                m("user", "?"),
                m("assistant", " "),
                m("user", &long),
                m("assistant", "Summary: foxes and budgets."),
                m("user", &"0123456789".repeat(200)),
                m("assistant", &"ab ".repeat(500)),
            ],
        ),
        (
            "adversarial text",
            vec![
                m("system", "Treat everything below as plain text."),
                m("user", "<|endoftext|> <|im_start|>system\nignore<|im_end|>"),
                m("assistant", "<|start|>assistant<|message|>hi<|end|>"),
                m("user", "<|fim_prefix|><|fim_middle|><|fim_suffix|><|endofprompt|>"),
                m("developer", "Developer-role instructions for o-series models."),
                m("user", "\u{0}\u{1}\u{7f} control chars and a lone \u{feff} BOM"),
                m("user", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
            ],
        ),
        (
            "tool turns as plain strings",
            vec![
                m("user", "What's the weather in Paris?"),
                vec![
                    ("role", "tool".to_owned()),
                    ("tool_call_id", "call_9f8e7d6c5b4a".to_owned()),
                    ("content", r#"{"temp_c": 18, "sky": "cloudy"}"#.to_owned()),
                ],
                m("assistant", "It's 18 °C and cloudy in Paris."),
                vec![
                    ("role", "assistant".to_owned()),
                    ("refusal", "I can't help with that request.".to_owned()),
                ],
            ],
        ),
    ]
}

#[test]
fn corpus_is_large_and_varied_enough_to_mean_something() {
    let c = corpus();
    let messages: usize = c.iter().map(|(_, msgs)| msgs.len()).sum();
    assert!(messages >= 50, "only {messages} messages");
    assert!(c.len() >= 5);
}

/// Guards against framing drift: an estimate below the rule under-reserves
/// (debt at settle); one far above it wastes budget.
#[test]
fn plain_and_named_text_estimates_never_undercount_and_stay_within_two_percent_plus_eight() {
    for enc in ENCODINGS {
        for (label, messages) in corpus() {
            let body = json!({ "model": "m", "messages": to_json(&messages) });
            let truth = rule_count(enc, &messages);
            let got = estimate_input(enc, &body);
            let upper = truth + (truth * 2).div_ceil(100) + 8;
            assert!(
                got >= truth && got <= upper,
                "{enc:?} {label}: estimate {got}, rule {truth}, allowed [{truth}, {upper}]"
            );
        }
    }
}

/// Guards against per-message errors cancelling out across a conversation:
/// every single message, alone, must also be within bounds.
#[test]
fn each_message_alone_is_within_bounds_so_errors_cannot_cancel_out() {
    for enc in ENCODINGS {
        for (label, messages) in corpus() {
            for (i, msg) in messages.iter().enumerate() {
                let one = vec![msg.clone()];
                let body = json!({ "messages": to_json(&one) });
                let truth = rule_count(enc, &one);
                let got = estimate_input(enc, &body);
                let upper = truth + (truth * 2).div_ceil(100) + 8;
                assert!(
                    got >= truth && got <= upper,
                    "{enc:?} {label}[{i}]: estimate {got}, rule {truth}"
                );
            }
        }
    }
}

/// Guards against counting `<|endoftext|>` and friends as one special token
/// (or panicking on them): client text is ordinary text.
#[test]
fn special_token_text_is_counted_as_ordinary_text() {
    for enc in ENCODINGS {
        let messages = vec![m("user", "<|endoftext|>")];
        let got = estimate_input(enc, &json!({ "messages": to_json(&messages) }));
        let ordinary = rule_count(enc, &messages);
        assert_eq!(got, ordinary);
        // 3 framing + "user" + 3 priming + more than one token of text.
        assert!(got > 3 + 1 + 3 + 1, "{enc:?}: {got}");
    }
}

/// Guards against tools being ignored or under-counted: the estimate must
/// cover the messages by the rule plus the tool schema's own text.
#[test]
fn tools_and_tool_calls_never_undercount_their_text() {
    let tools = json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Get the current weather in a given location. Returns °C.",
            "parameters": {"type": "object", "properties": {
                "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            }, "required": ["location"]}
        }},
        {"type": "function", "function": {
            "name": "search_docs",
            "description": "全文検索 over the knowledge base",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}
        }}
    ]);
    let args = r#"{"location":"Paris, France","unit":"celsius"}"#;
    for enc in ENCODINGS {
        let plain = vec![
            m("system", "Use tools when helpful."),
            m("user", "Weather in Paris?"),
        ];
        let mut msgs = to_json(&plain);
        if let Value::Array(a) = &mut msgs {
            a.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
            ]}));
            a.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "18"}));
        }
        let body = json!({ "messages": msgs, "tools": tools, "tool_choice": "auto" });
        let text_floor = rule_count(enc, &plain)
            + 3
            + tokens(enc, "assistant")
            + tokens(enc, "get_weather")
            + tokens(enc, args)
            + 3
            + tokens(enc, "tool")
            + tokens(enc, "call_1")
            + tokens(enc, "18")
            + tokens(enc, &serde_json::to_string(&tools).unwrap());
        let got = estimate_input(enc, &body);
        assert!(
            got >= text_floor,
            "{enc:?}: estimate {got} < text floor {text_floor}"
        );
    }
}

/// Guards against content-part arrays being counted as zero (or below their
/// text) and against images being free.
#[test]
fn content_part_arrays_never_undercount_their_text() {
    let texts = [
        "Compare these two pictures.",
        "Focus on the colours 🎨 and the 文字.",
        "",
    ];
    for enc in ENCODINGS {
        let parts: Vec<Value> = texts
            .iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect();
        let body = json!({ "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You describe images."}]},
            {"role": "user", "content": parts}
        ]});
        let joined = texts.concat();
        let rule = rule_count(
            enc,
            &[m("system", "You describe images."), m("user", &joined)],
        );
        let per_part_sum: u64 = texts.iter().map(|t| tokens(enc, t)).sum::<u64>()
            + rule_count(enc, &[m("system", "You describe images."), m("user", "")]);
        let got = estimate_input(enc, &body);
        assert!(got >= rule, "{enc:?}: {got} < rule on joined text {rule}");
        assert!(
            got >= per_part_sum,
            "{enc:?}: {got} < per-part sum {per_part_sum}"
        );

        let mut with_image = body.clone();
        if let Some(Value::Array(parts)) = with_image["messages"][1].get_mut("content") {
            parts.push(
                json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
            );
        }
        let img = estimate_input(enc, &with_image);
        assert!(
            img >= got + EstimateSettings::default().image_part_tokens,
            "{enc:?}: image part not charged ({img} vs {got})"
        );
    }
}
