//! `kind = "gemini"`: Google's Gemini API (docs/GEMINI.md). Defaults the
//! validation fills in; what a Gemini request costs is the estimator's and
//! the dialect's.

/// The Gemini API's endpoint when a deployment sets no `base_url`: the
/// models live under `{base}/models/{model}:generateContent`, the
/// OpenAI-compatible endpoint under `{base}/openai/`.
pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com/v1beta";

/// Gemini tokens per 1000 `o200k_base` tokens of text, when a model sets
/// no `token_ratio`: Gemini's SentencePiece vocabulary is not shipped with
/// the gateway, so its text is counted with tiktoken and scaled up by this
/// safety factor (docs/GEMINI.md, "Input estimate", says how it was set).
pub const DEFAULT_TOKEN_RATIO: u64 = 1300;
