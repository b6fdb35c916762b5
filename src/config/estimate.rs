//! `[estimation]` and a model's tiktoken encoding, validated: the knobs
//! of the input estimate. Counting tokens is [`crate::estimate`]'s.

/// Which tiktoken encoding a model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// `o200k_base`: gpt-4o, gpt-4.1, gpt-5 and the o-series.
    O200kBase,
    /// `cl100k_base`: gpt-4, gpt-3.5-turbo, text-embedding-3 / ada-002.
    Cl100kBase,
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Encoding {
    /// The name as written in config and in tiktoken: `o200k_base`, `cl100k_base`.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }

    /// Parses an encoding name as written in config: `"o200k_base"` or
    /// `"cl100k_base"`. Anything else is `None`.
    pub fn parse(name: &str) -> Option<Encoding> {
        match name {
            "o200k_base" => Some(Encoding::O200kBase),
            "cl100k_base" => Some(Encoding::Cl100kBase),
            _ => None,
        }
    }

    /// The encoding OpenAI uses for a model name, by prefix (ASCII
    /// case-insensitive; a fine-tune `ft:` prefix is looked through).
    ///
    /// `gpt-4o*`, `chatgpt-4o*`, `gpt-4.1*`, `gpt-5*`, `gpt-oss*`, `o1*`,
    /// `o3*`, `o4*` → `o200k_base`; `gpt-4*`, `gpt-3.5*`,
    /// `text-embedding-3*`, `text-embedding-ada-002`, `davinci-002`,
    /// `babbage-002` → `cl100k_base`; anything else (e.g. an Azure deployment
    /// name) → `None`, and the caller uses its configured default.
    pub fn for_model(model: &str) -> Option<Encoding> {
        let lower = model.to_ascii_lowercase();
        let name = lower.strip_prefix("ft:").unwrap_or(&lower);
        const O200K: &[&str] = &[
            "gpt-4o",
            "chatgpt-4o",
            "gpt-4.1",
            "gpt-5",
            "gpt-oss",
            "o1",
            "o3",
            "o4",
        ];
        const CL100K: &[&str] = &[
            "gpt-4",
            "gpt-3.5",
            "text-embedding-3",
            "text-embedding-ada-002",
            "davinci-002",
            "babbage-002",
        ];
        if O200K.iter().any(|p| name.starts_with(p)) {
            Some(Encoding::O200kBase)
        } else if CL100K.iter().any(|p| name.starts_with(p)) {
            Some(Encoding::Cl100kBase)
        } else {
            None
        }
    }
}

/// How the relay meters a stream's output (`estimation.stream_counting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamCounting {
    /// Deltas are counted only when the most tokens they can be (one per
    /// byte) could reach a limit, and for a settlement without the
    /// upstream's usage (DESIGN section 19). The default.
    #[default]
    Bound,
    /// Every delta is counted as it passes: the reference the bound-first
    /// relay is tested against. Same cutoffs and settlements, more work.
    Exact,
}

/// Tokens charged for one image part of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageCost {
    /// `detail: "low"`.
    pub low: u64,
    /// `"high"`, `"auto"` or no `detail`: the most the model's rule allows.
    pub high: u64,
}

/// Estimation knobs from config. All costs are in tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EstimateSettings {
    /// Tokens charged per image content part, any `detail`, for a model
    /// no published rule ([`ImageCost::for_model`]) or configured
    /// [`image_tokens`](Self::image_tokens) entry covers. Default 1536:
    /// at least the high-detail maximum of gpt-4o / gpt-4.1 (85 + 8 tiles ×
    /// 170 = 1445 tokens) and of o1 / o3 (75 + 8 × 150 = 1275), and equal to
    /// the 1536-patch cap of patch-based models before their multiplier.
    pub image_part_tokens: u64,
    /// `[estimation.image_tokens]`: image costs by model-name prefix
    /// (lower case), ahead of the published rules; longest prefix wins.
    pub image_tokens: Vec<(String, ImageCost)>,
    /// Tokens charged per `input_audio` or `file` content part. Default
    /// 4096. There is no way to size these from the part without decoding
    /// it; configure from observed usage.
    pub audio_part_tokens: u64,
    /// Margin, in percent, added (rounded up) to the token count of
    /// structured content: tools / functions definitions, tool calls,
    /// content-part text, JSON schemas. Default 10.
    pub structured_margin_percent: u64,
    /// Tokens added once per request when any structured content is present
    /// (covers the framing OpenAI adds around tool definitions and parts).
    /// Default 32.
    pub structured_margin_tokens: u64,
}

impl Default for EstimateSettings {
    fn default() -> Self {
        EstimateSettings {
            image_part_tokens: 1536,
            image_tokens: Vec::new(),
            audio_part_tokens: 4096,
            structured_margin_percent: 10,
            structured_margin_tokens: 32,
        }
    }
}
