//! What the relay reads of a chat completions stream chunk (OpenAI API
//! reference, "The chat completion chunk object"), borrowed from the
//! chunk's JSON without building it as a tree: `id`, `model`, `created`,
//! `usage` (raw), `error` (raw), and per choice its `index`,
//! `finish_reason` and the delta's output strings (`content`, `refusal`,
//! tool-call and function-call names and arguments; [`super::chat::count_output`]
//! counts the same strings).
//!
//! A chunk whose fields have other types than these (a numeric
//! `content`, a negative `index`, a duplicated key) does not parse: the
//! caller reads it as a tree instead, with the tree's rules.

use std::borrow::Cow;

use serde::Deserialize;

use super::json_scan::{Fields, Scan};
use super::stream_fields::{Object, Raw};

/// One chunk.
#[derive(Debug, Deserialize)]
pub struct Chunk<'a> {
    /// `id`.
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    /// `model`.
    #[serde(borrow, default)]
    pub model: Option<Cow<'a, str>>,
    /// `created`.
    #[serde(default)]
    pub created: Option<i64>,
    /// `usage`, unparsed (`null` reads as absent).
    #[serde(borrow, default)]
    pub usage: Option<Raw<'a>>,
    /// `error`, unparsed (`null` reads as absent).
    #[serde(borrow, default)]
    pub error: Option<Raw<'a>>,
    /// `choices` (`null` reads as absent).
    #[serde(borrow, default)]
    pub choices: Option<Vec<Object<Choice<'a>>>>,
}

/// One choice of a chunk.
#[derive(Debug, Deserialize)]
pub struct Choice<'a> {
    /// `index` (absent: 0).
    #[serde(default)]
    pub index: Option<u64>,
    /// `finish_reason`, unparsed (`null` reads as absent).
    #[serde(borrow, default)]
    pub finish_reason: Option<Raw<'a>>,
    /// `delta`.
    #[serde(borrow, default)]
    pub delta: Option<Object<Delta<'a>>>,
}

/// The output strings of a delta.
#[derive(Debug, Default, Deserialize)]
pub struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<Object<ToolCall<'a>>>>,
    #[serde(borrow, default)]
    function_call: Option<Object<Function<'a>>>,
}

#[derive(Debug, Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow, default)]
    function: Option<Object<Function<'a>>>,
}

#[derive(Debug, Deserialize)]
struct Function<'a> {
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

impl<'a> Chunk<'a> {
    /// Parses a chunk's data; `None` when it is not a chunk of these shapes.
    pub fn parse(data: &'a str) -> Option<Chunk<'a>> {
        let mut s = Scan::new(data);
        let chunk = Self::scan(&mut s)?;
        s.end()?;
        Some(chunk)
    }

    /// The chunk read by [`Scan`], as serde's derive above reads it.
    fn scan(s: &mut Scan<'a>) -> Option<Self> {
        let mut c = Chunk {
            id: None,
            model: None,
            created: None,
            usage: None,
            error: None,
            choices: None,
        };
        let mut seen = Fields::default();
        s.object(|s, key| {
            match &*key {
                "id" => c.id = seen.once(0, s, |s| s.string())?,
                "model" => c.model = seen.once(1, s, |s| s.string())?,
                "created" => c.created = seen.once(2, s, |s| s.i64())?,
                "usage" => c.usage = seen.once(3, s, raw)?,
                "error" => c.error = seen.once(4, s, raw)?,
                "choices" => {
                    c.choices = seen.once(5, s, |s| {
                        let mut v = Vec::with_capacity(1);
                        s.array(|s| {
                            v.push(Object(Choice::scan(s)?));
                            Some(())
                        })?;
                        Some(v)
                    })?
                }
                _ => s.skip()?,
            }
            Some(())
        })?;
        Some(c)
    }
}

impl<'a> Choice<'a> {
    fn scan(s: &mut Scan<'a>) -> Option<Self> {
        let mut c = Choice {
            index: None,
            finish_reason: None,
            delta: None,
        };
        let mut seen = Fields::default();
        s.object(|s, key| {
            match &*key {
                "index" => c.index = seen.once(0, s, |s| s.u64())?,
                "finish_reason" => c.finish_reason = seen.once(1, s, raw)?,
                "delta" => {
                    c.delta = seen.once(2, s, |s| {
                        let mut d = Delta::default();
                        let mut seen = Fields::default();
                        s.object(|s, key| {
                            match &*key {
                                "content" => d.content = seen.once(0, s, |s| s.string())?,
                                "refusal" => d.refusal = seen.once(1, s, |s| s.string())?,
                                "tool_calls" => {
                                    d.tool_calls = seen.once(2, s, |s| {
                                        let mut v = Vec::new();
                                        s.array(|s| {
                                            v.push(Object(ToolCall::scan(s)?));
                                            Some(())
                                        })?;
                                        Some(v)
                                    })?
                                }
                                "function_call" => {
                                    d.function_call =
                                        seen.once(3, s, |s| Function::scan(s).map(Object))?
                                }
                                _ => s.skip()?,
                            }
                            Some(())
                        })?;
                        Some(Object(d))
                    })?
                }
                _ => s.skip()?,
            }
            Some(())
        })?;
        Some(c)
    }
}

impl<'a> ToolCall<'a> {
    fn scan(s: &mut Scan<'a>) -> Option<Self> {
        let mut function = None;
        let mut seen = Fields::default();
        s.object(|s, key| {
            match &*key {
                "function" => function = seen.once(0, s, |s| Function::scan(s).map(Object))?,
                _ => s.skip()?,
            }
            Some(())
        })?;
        Some(ToolCall { function })
    }
}

impl<'a> Function<'a> {
    fn scan(s: &mut Scan<'a>) -> Option<Self> {
        let mut f = Function {
            arguments: None,
            name: None,
        };
        let mut seen = Fields::default();
        s.object(|s, key| {
            match &*key {
                "arguments" => f.arguments = seen.once(0, s, |s| s.string())?,
                "name" => f.name = seen.once(1, s, |s| s.string())?,
                _ => s.skip()?,
            }
            Some(())
        })?;
        Some(f)
    }
}

/// A raw value (`null` was read as absent before).
fn raw<'a>(s: &mut Scan<'a>) -> Option<Raw<'a>> {
    s.raw().map(Raw)
}

impl Delta<'_> {
    /// The strings whose tokens are output, in the order `count_output` counts them.
    pub fn output_strings(&self) -> impl Iterator<Item = &str> + Clone {
        fn function<'s>(f: &'s Object<Function<'_>>) -> [Option<&'s str>; 2] {
            [f.0.arguments.as_deref(), f.0.name.as_deref()]
        }
        let calls = self
            .tool_calls
            .iter()
            .flatten()
            .filter_map(|c| c.0.function.as_ref())
            .flat_map(function);
        [self.content.as_deref(), self.refusal.as_deref()]
            .into_iter()
            .chain(calls)
            .chain(self.function_call.iter().flat_map(function))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::estimate::Encoding;
    use crate::dialects::Part;
    use serde_json::Value;

    /// The strings read are the ones the tree's count counts.
    #[test]
    fn output_strings_count_as_the_tree_counts() {
        let chunks = [
            r#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi \u00e9"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"a\":"}},{"function":{"arguments":"1}"}}]},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[{"delta":{"refusal":"no","function_call":{"name":"g","arguments":"x"}}}],"usage":null}"#,
            r#"{"choices":[{"delta":null}],"created":5}"#,
        ];
        for data in chunks {
            let chunk = Chunk::parse(data).expect(data);
            let tree: Value = serde_json::from_str(data).unwrap();
            for (c, t) in chunk
                .choices
                .iter()
                .flatten()
                .zip(tree["choices"].as_array().unwrap())
            {
                let ours: u64 =
                    c.0.delta
                        .iter()
                        .map(|d| &d.0)
                        .flat_map(Delta::output_strings)
                        .map(|s| Encoding::O200kBase.count(s))
                        .sum();
                let theirs = super::super::chat::count_output(t, Part::Delta, Encoding::O200kBase);
                assert_eq!(ours, theirs, "{data}");
            }
        }
        assert!(Chunk::parse(r#"{"choices":[{"index":-1}]}"#).is_none());
        assert!(Chunk::parse(r#"{"choices":[{"delta":{"content":5}}]}"#).is_none());
        assert!(Chunk::parse(r#"{"id":"a","id":"b"}"#).is_none());
        let nulls =
            Chunk::parse(r#"{"usage":null,"error":null,"choices":[{"finish_reason":null}]}"#)
                .unwrap();
        assert!(nulls.usage.is_none() && nulls.error.is_none());
        assert!(nulls.choices.unwrap()[0].0.finish_reason.is_none());
        assert!(Chunk::parse(r#"{"choices":[{"delta":["x"]}]}"#).is_none());
        assert!(Chunk::parse(r#"["id"]"#).is_none());
    }

    /// Serde's derive of the same structs: the reference the reader must match.
    fn by_serde(data: &str) -> Option<Chunk<'_>> {
        crate::dialects::stream_fields::parse(data)
    }

    #[test]
    fn the_reader_refuses_only_what_it_leaves_to_serde() {
        // Accepted by serde, left to the tree by the reader (stricter).
        for data in [
            r#"{"created":1e3}"#,
            r#"{"x":1.5e3}"#,
            r#"{"x":"\ud83d"}"#,
            r#"{"x":123456789012345678901234}"#,
        ] {
            assert!(Chunk::parse(data).is_none(), "{data}");
        }
        // Refused by both.
        for data in [
            r#"{"id":"a"} x"#,
            r#"{"id":"a",}"#,
            r#"{"choices":[{"index":1.0}]}"#,
            "[]",
            "",
        ] {
            assert!(
                Chunk::parse(data).is_none() && by_serde(data).is_none(),
                "{data}"
            );
        }
    }

    mod generated {
        use super::*;
        use crate::dialects::json_scan::generate::{object, or_other, string, value};
        use proptest::prelude::*;

        fn function() -> BoxedStrategy<String> {
            object(vec![
                ("arguments", or_other(string().boxed())),
                ("name", or_other(string().boxed())),
            ])
        }

        fn chunk() -> BoxedStrategy<String> {
            let call = object(vec![
                ("function", or_other(function())),
                ("index", any::<u8>().prop_map(|n| n.to_string()).boxed()),
            ]);
            let delta = object(vec![
                ("content", or_other(string().boxed())),
                ("refusal", or_other(string().boxed())),
                ("role", Just("\"assistant\"".to_string()).boxed()),
                (
                    "tool_calls",
                    or_other(
                        proptest::collection::vec(call, 0..3)
                            .prop_map(|v| format!("[{}]", v.join(",")))
                            .boxed(),
                    ),
                ),
                ("function_call", or_other(function())),
            ]);
            let choice = object(vec![
                (
                    "index",
                    or_other(
                        prop_oneof![
                            any::<u8>().prop_map(|n| n.to_string()),
                            Just("-1".to_string())
                        ]
                        .boxed(),
                    ),
                ),
                (
                    "finish_reason",
                    or_other(Just("\"stop\"".to_string()).boxed()),
                ),
                ("delta", or_other(delta)),
            ]);
            object(vec![
                ("id", or_other(string().boxed())),
                ("model", or_other(string().boxed())),
                (
                    "created",
                    or_other(any::<i64>().prop_map(|n| n.to_string()).boxed()),
                ),
                ("usage", or_other(value().boxed())),
                ("error", or_other(value().boxed())),
                (
                    "choices",
                    or_other(
                        proptest::collection::vec(choice, 0..3)
                            .prop_map(|v| format!("[{}]", v.join(",")))
                            .boxed(),
                    ),
                ),
            ])
        }

        /// The generated chunks are mostly readable ones, with escapes and
        /// text to read: a test that compared refusals only would pass
        /// whatever the reader read.
        #[test]
        fn the_generated_chunks_are_mostly_read() {
            use proptest::strategy::ValueTree;
            let mut runner = proptest::test_runner::TestRunner::deterministic();
            let (mut read, mut escaped, mut text) = (0, 0, 0);
            for _ in 0..1000 {
                let data = chunk().new_tree(&mut runner).expect("a chunk").current();
                if let Some(c) = Chunk::parse(&data) {
                    read += 1;
                    escaped += usize::from(data.contains('\\'));
                    let delivered: usize = c
                        .choices
                        .iter()
                        .flatten()
                        .filter_map(|c| c.0.delta.as_ref())
                        .flat_map(|d| d.0.output_strings())
                        .map(str::len)
                        .sum();
                    text += usize::from(delivered > 0);
                }
            }
            assert!(
                read > 300 && escaped > 100 && text > 30,
                "read {read}, escaped {escaped}, text {text}"
            );
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            /// On every generated chunk the reader and serde's derive
            /// agree: both refuse, or both read the same fields.
            #[test]
            fn the_reader_reads_what_serde_reads(data in chunk()) {
                let ours = Chunk::parse(&data).map(|c| format!("{c:?}"));
                let theirs = by_serde(&data).map(|c| format!("{c:?}"));
                prop_assert_eq!(ours, theirs, "{}", data);
            }
        }
    }
}
