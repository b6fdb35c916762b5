//! OpenAI embeddings (OpenAI API reference, "Embeddings"): input only, no
//! output and no streams; usage is `prompt_tokens` (or `total_tokens`).

use super::usage::{clamp_count, UsageBreakdown};

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
    let input = clamp_count(u.prompt_tokens.as_ref(), "prompt_tokens")
        .or_else(|| clamp_count(u.total_tokens.as_ref(), "total_tokens"));
    Some(UsageBreakdown {
        uncached_input: input,
        output: Some(0),
        ..UsageBreakdown::default()
    })
}
