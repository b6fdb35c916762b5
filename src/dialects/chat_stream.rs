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
use serde_json::value::RawValue;

use super::stream_fields::{self, Object};

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
    pub usage: Option<&'a RawValue>,
    /// `error`, unparsed (`null` reads as absent).
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
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
    pub finish_reason: Option<&'a RawValue>,
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

impl Chunk<'_> {
    /// Parses a chunk's data; `None` when it is not a chunk of these shapes.
    pub fn parse(data: &str) -> Option<Chunk<'_>> {
        stream_fields::parse(data)
    }
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
}
