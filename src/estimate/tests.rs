use crate::dialects::Dialect;
use serde_json::{json, Value};

use super::*;

fn model(encoding: Encoding) -> ModelEstimation {
    ModelEstimation {
        encoding,
        default_max_output_tokens: 1000,
        max_output_tokens: Some(4000),
        min_output_tokens: 16,
        token_ratio: 1000,
        image: crate::config::estimate::ImageCost::flat(1536),
    }
}

fn chat(body: Value) -> Result<Estimate, EstimateError> {
    estimate(
        Dialect::ChatCompletions,
        &body,
        &model(Encoding::O200kBase),
        &EstimateSettings::default(),
        TokenRoom::default(),
    )
}

fn chat_cap(body: Value, cap: u64) -> Result<Estimate, EstimateError> {
    estimate(
        Dialect::ChatCompletions,
        &body,
        &model(Encoding::O200kBase),
        &EstimateSettings::default(),
        TokenRoom::total(Some(cap)),
    )
}

fn completions(body: Value, cap: Option<u64>) -> Result<Estimate, EstimateError> {
    estimate(
        Dialect::Completions,
        &body,
        &model(Encoding::Cl100kBase),
        &EstimateSettings::default(),
        TokenRoom::total(cap),
    )
}

fn embeddings(body: Value) -> Result<Estimate, EstimateError> {
    estimate(
        Dialect::Embeddings,
        &body,
        &model(Encoding::Cl100kBase),
        &EstimateSettings::default(),
        TokenRoom::total(Some(1)),
    )
}

fn o200k(s: &str) -> u64 {
    Encoding::O200kBase.count(s)
}

fn invalid_param(r: Result<Estimate, EstimateError>) -> Option<String> {
    match r {
        Err(EstimateError::Invalid { param, .. }) => param,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

/// Input of one plain user message by the published rule.
fn rule_user(text: &str) -> u64 {
    TOKENS_PER_MESSAGE + o200k("user") + o200k(text) + REPLY_PRIMING_TOKENS
}

fn margin(structured: u64) -> u64 {
    let s = EstimateSettings::default();
    structured
        + (structured * s.structured_margin_percent).div_ceil(100)
        + s.structured_margin_tokens
}

// ---- encodings -------------------------------------------------------------

#[test]
fn encoding_names_parse_and_unknown_names_are_rejected() {
    assert_eq!(Encoding::parse("o200k_base"), Some(Encoding::O200kBase));
    assert_eq!(Encoding::parse("cl100k_base"), Some(Encoding::Cl100kBase));
    assert_eq!(Encoding::parse("p50k_base"), None);
    assert_eq!(Encoding::parse("O200K_BASE"), None);
}

#[test]
fn gpt4o_is_not_mistaken_for_gpt4_when_picking_an_encoding() {
    for m in [
        "gpt-4o",
        "gpt-4o-mini-2024-07-18",
        "gpt-4.1-nano",
        "gpt-5",
        "o1-mini",
        "o3",
        "o4-mini",
        "ft:gpt-4o-mini:acme::abc",
        "chatgpt-4o-latest",
    ] {
        assert_eq!(Encoding::for_model(m), Some(Encoding::O200kBase), "{m}");
    }
    for m in [
        "gpt-4",
        "gpt-4-turbo",
        "gpt-4-0613",
        "gpt-3.5-turbo",
        "gpt-3.5-turbo-instruct",
        "text-embedding-3-small",
        "text-embedding-ada-002",
    ] {
        assert_eq!(Encoding::for_model(m), Some(Encoding::Cl100kBase), "{m}");
    }
    for m in ["llama-3-70b", "my-azure-deployment", "claude", ""] {
        assert_eq!(Encoding::for_model(m), None, "{m}");
    }
}

#[test]
fn special_token_text_from_clients_counts_as_ordinary_text_without_panicking() {
    warm_up();
    for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
        assert!(enc.count("<|endoftext|>") > 1);
        assert!(enc.count("<|im_start|>system<|im_end|>") > 1);
        assert_eq!(enc.count(""), 0);
    }
}

// ---- chat framing ----------------------------------------------------------

#[test]
fn plain_text_message_matches_the_published_rule_exactly() {
    let e = chat(user("Hello, how are you today?")).unwrap();
    assert_eq!(e.input_tokens, rule_user("Hello, how are you today?"));
}

#[test]
fn name_field_costs_its_tokens_plus_one() {
    let body = json!({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "name": "alice_smith", "content": "hi"}
    ]});
    let want = 2 * TOKENS_PER_MESSAGE
        + o200k("system")
        + o200k("Be brief.")
        + o200k("user")
        + o200k("alice_smith")
        + TOKENS_PER_NAME
        + o200k("hi")
        + REPLY_PRIMING_TOKENS;
    assert_eq!(chat(body).unwrap().input_tokens, want);
}

#[test]
fn null_and_empty_content_count_only_framing() {
    let body = json!({"messages": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": null}
    ]});
    let want = 2 * TOKENS_PER_MESSAGE + o200k("user") + o200k("assistant") + REPLY_PRIMING_TOKENS;
    assert_eq!(chat(body).unwrap().input_tokens, want);
}

#[test]
fn tool_call_id_and_refusal_strings_are_counted() {
    let body = json!({"messages": [
        {"role": "tool", "tool_call_id": "call_abc123XYZ", "content": "42"},
        {"role": "assistant", "content": null, "refusal": "I cannot help with that."}
    ]});
    let want = 2 * TOKENS_PER_MESSAGE
        + o200k("tool")
        + o200k("call_abc123XYZ")
        + o200k("42")
        + o200k("assistant")
        + o200k("I cannot help with that.")
        + REPLY_PRIMING_TOKENS;
    assert_eq!(chat(body).unwrap().input_tokens, want);
}

#[test]
fn text_content_parts_get_the_structured_margin() {
    let text = "Describe the weather in Paris in one sentence.";
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": text}
    ]}]});
    let want = TOKENS_PER_MESSAGE + o200k("user") + REPLY_PRIMING_TOKENS + margin(o200k(text));
    assert_eq!(chat(body).unwrap().input_tokens, want);
}

#[test]
fn image_parts_cost_the_models_price_for_their_detail_and_audio_a_flat_amount() {
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/x.png", "detail": "low"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-abc"}}
    ]}]});
    let settings = EstimateSettings {
        audio_part_tokens: 300,
        structured_margin_tokens: 5,
        ..EstimateSettings::default()
    };
    let m = ModelEstimation {
        image: crate::config::estimate::ImageCost {
            low: 100,
            high: 1000,
        },
        ..model(Encoding::O200kBase)
    };
    let e = estimate(
        Dialect::ChatCompletions,
        &body,
        &m,
        &settings,
        TokenRoom::default(),
    )
    .unwrap();
    // The base64 payloads are never tokenised as text; `detail` nests in
    // `image_url` in chat.
    let want = TOKENS_PER_MESSAGE + o200k("user") + REPLY_PRIMING_TOKENS + 1000 + 100 + 2 * 300 + 5;
    assert_eq!(e.input_tokens, want);
}

#[test]
fn unknown_content_part_types_are_counted_by_serialisation() {
    let part = json!({"type": "mystery", "payload": "some words that must be paid for"});
    let ser = serde_json::to_string(&part).unwrap();
    let body = json!({"messages": [{"role": "user", "content": [part]}]});
    let want = TOKENS_PER_MESSAGE + o200k("user") + REPLY_PRIMING_TOKENS + margin(o200k(&ser));
    assert_eq!(chat(body).unwrap().input_tokens, want);
}

#[test]
fn tool_definitions_are_counted_with_margin() {
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }}]);
    let ser = serde_json::to_string(&tools).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools});
    let e = chat(body).unwrap();
    assert_eq!(e.input_tokens, rule_user("hi") + margin(o200k(&ser)));
    assert!(e.input_tokens > rule_user("hi") + o200k(&ser));
}

#[test]
fn legacy_functions_and_json_schema_response_format_are_counted() {
    let functions = json!([{"name": "f", "parameters": {"type": "object"}}]);
    let schema = json!({"name": "answer", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}});
    let body = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "functions": functions,
        "response_format": {"type": "json_schema", "json_schema": schema}
    });
    let s = o200k(&serde_json::to_string(&functions).unwrap())
        + o200k(&serde_json::to_string(&schema).unwrap());
    assert_eq!(
        chat(body).unwrap().input_tokens,
        rule_user("hi") + margin(s)
    );
}

#[test]
fn assistant_tool_calls_are_framed_like_responses_function_calls() {
    let args = r#"{"city":"Paris","unit":"celsius"}"#;
    let body = json!({"messages": [
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"}
    ]});
    // One frame per call, exact (no margin), as in a Responses body; the
    // `tool` results follow the published rule for plain messages.
    let call = |name: &str, a: &str| {
        TOKENS_PER_MESSAGE
            + o200k("assistant")
            + FUNCTION_CALL_FRAMING_TOKENS
            + o200k(name)
            + o200k(a)
    };
    let tool_msg = |id: &str, c: &str| TOKENS_PER_MESSAGE + o200k("tool") + o200k(id) + o200k(c);
    let want = TOKENS_PER_MESSAGE
        + o200k("assistant")
        + call("get_weather", args)
        + call("get_time", "{}")
        + tool_msg("call_1", "18")
        + tool_msg("call_2", "noon")
        + REPLY_PRIMING_TOKENS;
    assert_eq!(chat(body).unwrap().input_tokens, want);

    let responses = json!({"input": [
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18"},
        {"type": "function_call_output", "call_id": "call_2", "output": "noon"}
    ]});
    let e = estimate(
        Dialect::Responses,
        &responses,
        &model(Encoding::O200kBase),
        &EstimateSettings::default(),
        TokenRoom::default(),
    )
    .unwrap();
    // A Responses output carries its call's name (charged with the call).
    let output = |name: &str, c: &str| {
        TOKENS_PER_MESSAGE + FUNCTION_OUTPUT_FRAMING_TOKENS + o200k(name) + o200k(c)
    };
    let want = call("get_weather", args)
        + call("get_time", "{}")
        + output("get_weather", "18")
        + output("get_time", "noon")
        + REPLY_PRIMING_TOKENS;
    assert_eq!(e.input_tokens, want);
}

#[test]
fn fixed_structured_margin_is_added_once_not_per_item() {
    let one = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]});
    let two = json!({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}]}
    ]});
    let s = EstimateSettings::default();
    let per_msg = TOKENS_PER_MESSAGE + o200k("user");
    let a = o200k("a");
    assert_eq!(
        chat(one).unwrap().input_tokens,
        per_msg + REPLY_PRIMING_TOKENS + margin(a)
    );
    assert_eq!(
        chat(two).unwrap().input_tokens,
        2 * per_msg
            + REPLY_PRIMING_TOKENS
            + 2 * a
            + (2 * a * s.structured_margin_percent).div_ceil(100)
            + s.structured_margin_tokens
    );
}

// ---- chat validation -------------------------------------------------------

#[test]
fn non_object_bodies_are_rejected() {
    for body in [json!([]), json!("x"), json!(null), json!(3)] {
        assert_eq!(invalid_param(chat(body.clone())), None);
        assert_eq!(invalid_param(completions(body.clone(), None)), None);
        assert_eq!(invalid_param(embeddings(body)), None);
    }
}

#[test]
fn missing_empty_or_malformed_messages_are_rejected_with_param_messages() {
    for body in [
        json!({}),
        json!({"messages": null}),
        json!({"messages": []}),
        json!({"messages": "hello"}),
        json!({"messages": {"role": "user"}}),
        json!({"messages": ["hello"]}),
        json!({"messages": [{"role": "user", "content": "ok"}, 5]}),
    ] {
        assert_eq!(
            invalid_param(chat(body.clone())).as_deref(),
            Some("messages"),
            "{body}"
        );
    }
}

#[test]
fn out_of_range_output_caps_are_rejected_with_their_param() {
    for param in ["max_tokens", "max_completion_tokens"] {
        for bad in [
            json!(0),
            json!(-5),
            json!(1.5),
            json!(10.0),
            json!("100"),
            json!(true),
            json!([1]),
        ] {
            let mut body = user("hi");
            body[param] = bad.clone();
            assert_eq!(
                invalid_param(chat(body)).as_deref(),
                Some(param),
                "{param}={bad}"
            );
        }
        let mut body = user("hi");
        body[param] = json!(4001);
        assert_eq!(invalid_param(chat(body)).as_deref(), Some(param));
        let mut body = user("hi");
        body[param] = json!(4000);
        assert_eq!(chat(body).unwrap().output_tokens_per_choice, 4000);
    }
}

#[test]
fn without_a_configured_limit_any_cap_is_taken_and_the_default_kept() {
    let me = ModelEstimation {
        max_output_tokens: None,
        ..model(Encoding::O200kBase)
    };
    let run = |body: Value| {
        estimate(
            Dialect::ChatCompletions,
            &body,
            &me,
            &EstimateSettings::default(),
            TokenRoom::default(),
        )
    };
    let mut body = user("hi");
    body["max_tokens"] = json!(32000);
    let e = run(body).unwrap();
    assert_eq!(e.client_max_output, Some(32000));
    assert_eq!(e.output_tokens_per_choice, 32000);
    assert_eq!(run(user("hi")).unwrap().output_tokens_per_choice, 1000);
}

#[test]
fn invalid_n_is_rejected() {
    for bad in [json!(0), json!(-1), json!(2.5), json!("2"), json!(129)] {
        let mut body = user("hi");
        body["n"] = bad.clone();
        assert_eq!(invalid_param(chat(body)).as_deref(), Some("n"), "n={bad}");
    }
    let mut body = user("hi");
    body["n"] = json!(128);
    assert_eq!(chat(body).unwrap().choices, 128);
}

#[test]
fn null_output_params_mean_absent() {
    let mut body = user("hi");
    body["max_tokens"] = Value::Null;
    body["max_completion_tokens"] = Value::Null;
    body["n"] = Value::Null;
    let e = chat(body).unwrap();
    assert_eq!(e.choices, 1);
    assert_eq!(e.client_max_output, None);
    assert_eq!(e.output_tokens_per_choice, 1000);
}

// ---- output caps -----------------------------------------------------------

#[test]
fn larger_of_max_tokens_and_max_completion_tokens_is_reserved() {
    let mut body = user("hi");
    body["max_tokens"] = json!(300);
    body["max_completion_tokens"] = json!(200);
    body["n"] = json!(3);
    let e = chat(body).unwrap();
    assert_eq!(e.client_max_output, Some(300));
    assert_eq!(e.output_tokens_per_choice, 300);
    assert_eq!(e.choices, 3);
    assert_eq!(e.output_tokens, 900);
    assert_eq!(e.total_tokens, e.input_tokens + 900);
    assert!(!e.lowered_default);

    let mut body = user("hi");
    body["max_tokens"] = json!(50);
    body["max_completion_tokens"] = json!(700);
    assert_eq!(chat(body).unwrap().output_tokens_per_choice, 700);
}

#[test]
fn default_is_used_when_it_fits_or_no_capacity_is_known() {
    let e = chat(user("hi")).unwrap();
    assert_eq!(e.output_tokens_per_choice, 1000);
    assert!(!e.lowered_default);
    let input = rule_user("hi");
    let e = chat_cap(user("hi"), input + 1000).unwrap();
    assert_eq!(e.output_tokens_per_choice, 1000);
    assert_eq!(e.total_tokens, input + 1000);
    assert!(!e.lowered_default);
}

#[test]
fn default_is_lowered_to_fit_capacity_per_choice() {
    let input = rule_user("hi");
    let mut body = user("hi");
    body["n"] = json!(3);
    let cap = input + 3 * 100 + 2; // floor((cap - input) / 3) = 100
    let e = chat_cap(body, cap).unwrap();
    assert!(e.lowered_default);
    assert_eq!(e.output_tokens_per_choice, 100);
    assert_eq!(e.output_tokens, 300);
    assert!(e.total_tokens <= cap);
    assert_eq!(e.client_max_output, None);
}

#[test]
fn lowering_stops_at_min_output_and_below_that_is_impossible() {
    let input = rule_user("hi");
    // Exactly min fits.
    let e = chat_cap(user("hi"), input + 16).unwrap();
    assert_eq!(e.output_tokens_per_choice, 16);
    assert!(e.lowered_default);
    // One token short of min.
    assert_eq!(
        chat_cap(user("hi"), input + 15),
        Err(EstimateError::Impossible {
            needed: input + 16,
            capacity: input + 15
        })
    );
    // Prompt alone exceeds capacity.
    assert_eq!(
        chat_cap(user("hi"), 2),
        Err(EstimateError::Impossible {
            needed: input + 16,
            capacity: 2
        })
    );
    // n multiplies the minimum.
    let mut body = user("hi");
    body["n"] = json!(4);
    assert_eq!(
        chat_cap(body, input + 63),
        Err(EstimateError::Impossible {
            needed: input + 64,
            capacity: input + 63
        })
    );
}

#[test]
fn client_cap_is_never_lowered_even_when_it_exceeds_capacity() {
    let mut body = user("hi");
    body["max_tokens"] = json!(3000);
    let e = chat_cap(body, 10).unwrap();
    assert_eq!(e.output_tokens_per_choice, 3000);
    assert!(!e.lowered_default);
}

#[test]
fn impossible_error_message_names_both_figures() {
    let msg = EstimateError::Impossible {
        needed: 123,
        capacity: 45,
    }
    .to_string();
    assert!(msg.contains("123") && msg.contains("45"), "{msg}");
}

// ---- legacy completions ----------------------------------------------------

#[test]
fn completions_prompt_shapes_are_counted() {
    let cl = |s: &str| Encoding::Cl100kBase.count(s);
    let e = completions(json!({"prompt": "Say this is a test"}), None).unwrap();
    assert_eq!(e.input_tokens, cl("Say this is a test"));
    assert_eq!(e.choices, 1);

    let e = completions(json!({"prompt": ["one two", "three"]}), None).unwrap();
    assert_eq!(e.input_tokens, cl("one two") + cl("three"));

    let e = completions(json!({"prompt": [1, 2, 3, 4]}), None).unwrap();
    assert_eq!(e.input_tokens, 4);
    assert_eq!(e.choices, 1);

    let e = completions(json!({"prompt": [[1, 2], [3, 4, 5]]}), None).unwrap();
    assert_eq!(e.input_tokens, 5);

    let e = completions(json!({"prompt": "def f(", "suffix": "return x"}), None).unwrap();
    assert_eq!(e.input_tokens, cl("def f(") + cl("return x"));
}

#[test]
fn batched_completion_prompts_reserve_output_for_every_prompt() {
    let e = completions(
        json!({"prompt": ["a", "b", "c"], "max_tokens": 10, "n": 2}),
        None,
    )
    .unwrap();
    assert_eq!(e.choices, 6);
    assert_eq!(e.output_tokens, 60);
    let e = completions(json!({"prompt": [[1], [2]], "max_tokens": 10}), None).unwrap();
    assert_eq!(e.choices, 2);
}

#[test]
fn completions_multiply_output_by_the_larger_of_n_and_best_of() {
    let e = completions(
        json!({"prompt": "x", "max_tokens": 10, "n": 2, "best_of": 5}),
        None,
    )
    .unwrap();
    assert_eq!(e.choices, 5);
    assert_eq!(e.output_tokens, 50);
    let e = completions(
        json!({"prompt": "x", "max_tokens": 10, "n": 4, "best_of": 1}),
        None,
    )
    .unwrap();
    assert_eq!(e.choices, 4);
}

#[test]
fn completions_validation_errors_name_their_param() {
    for body in [
        json!({}),
        json!({"prompt": null}),
        json!({"prompt": []}),
        json!({"prompt": 5}),
        json!({"prompt": {"text": "x"}}),
        json!({"prompt": ["a", 1]}),
        json!({"prompt": [1, "a"]}),
        json!({"prompt": [1, -2]}),
        json!({"prompt": [1.5]}),
        json!({"prompt": [[1], []]}),
        json!({"prompt": [[1], 2]}),
        json!({"prompt": [true]}),
    ] {
        assert_eq!(
            invalid_param(completions(body.clone(), None)).as_deref(),
            Some("prompt"),
            "{body}"
        );
    }
    for (param, bad) in [
        ("best_of", json!(0)),
        ("best_of", json!(1.5)),
        ("n", json!(0)),
        ("max_tokens", json!(-1)),
        ("max_tokens", json!(4001)),
    ] {
        let mut body = json!({"prompt": "x"});
        body[param] = bad;
        assert_eq!(
            invalid_param(completions(body, None)).as_deref(),
            Some(param)
        );
    }
}

#[test]
fn completions_ignore_max_completion_tokens_and_lower_default_by_choices() {
    let input = Encoding::Cl100kBase.count("x");
    let e = completions(json!({"prompt": "x", "best_of": 2}), Some(input + 201)).unwrap();
    assert!(e.lowered_default);
    assert_eq!(e.choices, 2);
    assert_eq!(e.output_tokens_per_choice, 100);
}

// ---- embeddings ------------------------------------------------------------

#[test]
fn embeddings_cost_input_only_for_every_shape() {
    let cl = |s: &str| Encoding::Cl100kBase.count(s);
    for (input, want) in [
        (json!("hello world"), cl("hello world")),
        (
            json!(["hello", "world peace"]),
            cl("hello") + cl("world peace"),
        ),
        (json!([10, 20, 30]), 3),
        (json!([[10, 20], [30]]), 3),
    ] {
        // max_tokens / n on an embeddings body do not add output.
        let e = embeddings(json!({"input": input, "max_tokens": 500, "n": 3})).unwrap();
        assert_eq!(e.input_tokens, want);
        assert_eq!(e.output_tokens, 0);
        assert_eq!(e.choices, 0);
        assert_eq!(e.output_tokens_per_choice, 0);
        assert_eq!(e.total_tokens, want);
        assert!(!e.lowered_default);
    }
}

#[test]
fn empty_or_malformed_embeddings_input_is_rejected() {
    for body in [
        json!({}),
        json!({"input": null}),
        json!({"input": ""}),
        json!({"input": []}),
        json!({"input": [""]}),
        json!({"input": ["a", ""]}),
        json!({"input": [[]]}),
        json!({"input": [[1], []]}),
        json!({"input": [-1]}),
        json!({"input": {"a": 1}}),
        json!({"input": 7}),
    ] {
        assert_eq!(
            invalid_param(embeddings(body.clone())).as_deref(),
            Some("input"),
            "{body}"
        );
    }
}

// ---- robustness ------------------------------------------------------------

#[test]
fn huge_values_saturate_instead_of_overflowing() {
    let m = ModelEstimation {
        encoding: Encoding::Cl100kBase,
        default_max_output_tokens: u64::MAX,
        max_output_tokens: Some(u64::MAX),
        min_output_tokens: 16,
        token_ratio: 1000,
        image: crate::config::estimate::ImageCost::flat(1536),
    };
    let e = estimate(
        Dialect::Completions,
        &json!({"prompt": "x", "max_tokens": u64::MAX, "best_of": u64::MAX}),
        &m,
        &EstimateSettings::default(),
        TokenRoom::default(),
    )
    .unwrap();
    assert_eq!(e.output_tokens, u64::MAX);
    assert_eq!(e.total_tokens, u64::MAX);
    let e = estimate(
        Dialect::ChatCompletions,
        &user("hi"),
        &m,
        &EstimateSettings::default(),
        TokenRoom::total(Some(u64::MAX)),
    )
    .unwrap();
    assert!(e.lowered_default);
    // An overflowing minimum must read as "does not fit", not saturate into
    // a fit.
    let m = ModelEstimation {
        min_output_tokens: u64::MAX,
        token_ratio: 1000,
        image: crate::config::estimate::ImageCost::flat(1536),
        ..m
    };
    let mut body = user("hi");
    body["n"] = json!(2);
    let r = estimate(
        Dialect::ChatCompletions,
        &body,
        &m,
        &EstimateSettings::default(),
        TokenRoom::total(Some(u64::MAX)),
    );
    assert!(matches!(r, Err(EstimateError::Impossible { .. })), "{r:?}");
}

#[test]
fn odd_but_parseable_message_fields_never_panic_and_are_charged() {
    let body = json!({"messages": [
        {"role": "user", "content": {"weird": "object content"}},
        {"role": "user", "content": 12345},
        {"role": "user", "content": ["bare string part", 7, null, {"no_type": true}]},
        {"role": "assistant", "tool_calls": [5, {"type": "custom", "custom": {"name": "x", "input": "y"}}]},
        {"role": "assistant", "function_call": {"name": "f", "arguments": {"not": "a string"}}},
        {"role": "assistant", "audio": {"id": "audio_abc"}},
        {}
    ]});
    let e = chat(body).unwrap();
    assert!(e.input_tokens > 7 * TOKENS_PER_MESSAGE + REPLY_PRIMING_TOKENS);
}

#[test]
fn a_large_body_is_estimated_while_the_serving_thread_goes_on() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    // A single-threaded runtime, as each serving thread runs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ticks = Arc::new(AtomicU64::new(0));
    let seen = rt.block_on(async {
        let t = ticks.clone();
        let ticker = tokio::spawn(async move {
            loop {
                t.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        });
        let t = ticks.clone();
        let big = OFF_IO_THREAD_BYTES + 1;
        // The job blocks its thread until the ticker has run 100 times: it
        // can only finish if it does not run on the serving thread.
        let got = off_io_threads(big, move || {
            while t.load(Ordering::SeqCst) < 100 {
                std::thread::yield_now();
            }
            7
        })
        .await;
        ticker.abort();
        got
    });
    assert_eq!(seen, Some(7));
    // Small bodies run inline, as does a caller outside any runtime.
    let small = rt.block_on(off_io_threads(10, || 1));
    assert_eq!(small, Some(1));
    let outside =
        futures_util::FutureExt::now_or_never(off_io_threads(OFF_IO_THREAD_BYTES + 1, || 2));
    assert_eq!(outside, Some(Some(2)));
}

#[test]
fn repeated_bodies_estimate_the_same_through_the_cache() {
    let system = "You are a meticulous assistant; answer in JSON. ".repeat(100);
    let tools = json!([{"type": "function", "function": {
        "name": "lookup", "description": "d".repeat(300),
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]);
    let b = json!({
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
        "tools": tools,
    });
    let m = ModelEstimation {
        encoding: Encoding::O200kBase,
        default_max_output_tokens: 100,
        max_output_tokens: Some(1000),
        min_output_tokens: 16,
        token_ratio: 1000,
        image: crate::config::estimate::ImageCost::flat(1536),
    };
    let s = EstimateSettings::default();
    let first = estimate(Dialect::ChatCompletions, &b, &m, &s, TokenRoom::default()).unwrap();
    for _ in 0..3 {
        assert_eq!(
            estimate(Dialect::ChatCompletions, &b, &m, &s, TokenRoom::default()).unwrap(),
            first
        );
    }
    let expected_system = Encoding::O200kBase.count(&system);
    assert!(first.input_tokens > expected_system);
}
