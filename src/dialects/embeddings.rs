//! OpenAI embeddings (OpenAI API reference, "Embeddings"): input only, no
//! output and no streams; usage is `prompt_tokens` (or `total_tokens`).

use super::usage::{read_count, UsageBreakdown};

/// Path under an OpenAI-style base URL.
pub const PATH: &str = "embeddings";

/// Usage of an answer: all input, no output.
pub fn usage(raw: &str) -> Option<UsageBreakdown> {
    #[derive(serde::Deserialize)]
    struct Usage {
        prompt_tokens: Option<serde_json::Value>,
        total_tokens: Option<serde_json::Value>,
    }
    let u: Usage = serde_json::from_str(raw).ok()?;
    let mut rejected = None;
    let input = read_count(u.prompt_tokens.as_ref(), "prompt_tokens", &mut rejected)
        .or_else(|| read_count(u.total_tokens.as_ref(), "total_tokens", &mut rejected));
    let used = UsageBreakdown {
        uncached_input: input,
        output: Some(0),
        ..UsageBreakdown::default()
    };
    Some(match rejected {
        Some(field) => used.reject_input(field),
        None => used,
    })
}
