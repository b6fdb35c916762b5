//! Agent turns of a chosen size, grown from a recorded first turn the way
//! the coding-agent CLIs grow them: each step appends one tool call and its
//! result to the conversation, and the whole conversation is sent again.
//!
//! * Claude Code (Anthropic Messages): an assistant message (a thinking
//!   block with its signature, a line of text, a `tool_use` of `Read` or
//!   `Bash`), then a user message with the `tool_result`; the one
//!   `cache_control` breakpoint of the messages moves to the last block, as
//!   the CLI moves it every turn.
//! * Codex (Responses): a `reasoning` item (its opaque
//!   `encrypted_content`, which the request `include`s), then a
//!   `custom_tool_call` of its `exec` tool with its
//!   `custom_tool_call_output`, every fifth step a `function_call` of its
//!   `wait` function with its `function_call_output` instead.
//!
//! The results are source listings and command output drawn from a fixed
//! vocabulary by a seeded generator: the same recording and target give
//! the same bytes on every machine. A turn is the recording plus the
//! fewest steps whose input estimate (the caller's) reaches the target.
//! Shared by `examples/agent_replay/main.rs` (which writes the bodies for
//! `MODE=agent scripts/instructions.sh`) and the test that checks their
//! estimates (`tests/it/agent_replay.rs`).

use budgetgate::config::estimate::{Encoding, EstimateSettings, ImageCost};
use budgetgate::dialects::Dialect;
use budgetgate::estimate::{estimate, Estimate, EstimateError, ModelEstimation, TokenRoom};
use serde_json::{json, Map, Value};

/// Which CLI grows the turn, by the API its recording speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cli {
    /// Anthropic Messages: `tool_use` / `tool_result` blocks.
    ClaudeCode,
    /// Responses: `custom_tool_call` / `function_call` items and their outputs.
    Codex,
}

impl Cli {
    /// The CLI of a recording's `request` line (`recorded.json`).
    pub fn of_request(request: &str) -> Option<Cli> {
        if request.starts_with("POST /v1/messages") {
            Some(Cli::ClaudeCode)
        } else if request.starts_with("POST /v1/responses") {
            Some(Cli::Codex)
        } else {
            None
        }
    }

    pub fn dialect(self) -> Dialect {
        match self {
            Cli::ClaudeCode => Dialect::Messages,
            Cli::Codex => Dialect::Responses,
        }
    }
}

/// The estimate the gateway of `scripts/instructions.sh` makes of `body`
/// (its models: o200k_base, token ratio 1000, no output limit).
pub fn replay_estimate(cli: Cli, body: &Value) -> Result<Estimate, EstimateError> {
    let model = ModelEstimation {
        encoding: Encoding::O200kBase,
        default_max_output_tokens: 4_096,
        max_output_tokens: None,
        min_output_tokens: 16,
        token_ratio: 1_000,
        image: ImageCost { low: 85, high: 765 },
    };
    estimate(
        cli.dialect(),
        body,
        &model,
        &EstimateSettings::default(),
        TokenRoom::default(),
    )
}

/// [`replay_estimate`]'s input tokens (0 for a body it refuses).
pub fn input_tokens(cli: Cli, body: &Value) -> u64 {
    replay_estimate(cli, body).map_or(0, |e| e.input_tokens)
}

/// The input sizes replayed, in estimated input tokens.
pub const TARGETS: [u64; 3] = [15_000, 30_000, 60_000];

/// Most steps appended before giving up on a target (a recording whose
/// estimate does not grow with its messages would otherwise loop).
pub const MAX_STEPS: usize = 400;

/// A grown turn: the body and how many steps it took.
#[derive(Debug, Clone)]
pub struct Turn {
    pub body: Value,
    pub steps: usize,
    pub input_tokens: u64,
}

/// Grows `recorded` by steps until `estimate(body)` reaches `target` (at
/// least one step); `None` when [`MAX_STEPS`] steps do not reach it.
pub fn grow(
    recorded: &Value,
    cli: Cli,
    target: u64,
    estimate: &dyn Fn(&Value) -> u64,
) -> Option<Turn> {
    let mut body = recorded.clone();
    for step in 0..MAX_STEPS {
        append(&mut body, cli, step);
        let input_tokens = estimate(&body);
        if input_tokens >= target {
            return Some(Turn {
                body,
                steps: step + 1,
                input_tokens,
            });
        }
    }
    None
}

/// Appends step `step` (0-based) of `cli`'s conversation to `body`.
pub fn append(body: &mut Value, cli: Cli, step: usize) {
    let mut rng = Rng::new(0x5eed_0000 + step as u64);
    match cli {
        Cli::ClaudeCode => claude_code_step(body, step, &mut rng),
        Cli::Codex => codex_step(body, step, &mut rng),
    }
}

fn claude_code_step(body: &mut Value, step: usize, rng: &mut Rng) {
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
        return;
    };
    // The breakpoint moves: none left on earlier messages' blocks.
    for m in messages.iter_mut() {
        if let Some(Value::Array(blocks)) = m.get_mut("content") {
            for b in blocks.iter_mut().filter_map(Value::as_object_mut) {
                b.remove("cache_control");
            }
        }
    }
    let id = format!("toolu_01{}", rng.alnum(22));
    let path = rng.path();
    let (name, input, result) = if step % 3 == 2 {
        let command = format!("grep -rn \"{}\" src | head -80", rng.ident());
        (
            "Bash",
            json!({"command": command, "description": "Find where it is used"}),
            {
                let lines = 30 + rng.below(50);
                grep_output(rng, lines)
            },
        )
    } else {
        ("Read", json!({"file_path": path}), {
            let lines = 60 + rng.below(140);
            numbered(&source(rng, lines))
        })
    };
    messages.push(json!({
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "", "signature": rng.base64(344)},
            {"type": "text", "text": format!("Let me look at `{path}` next.")},
            {"type": "tool_use", "id": id, "name": name, "input": input},
        ],
    }));
    messages.push(json!({
        "role": "user",
        "content": [{
            "type": "tool_result",
            "tool_use_id": id,
            "content": result,
            "cache_control": {"type": "ephemeral"},
        }],
    }));
}

fn codex_step(body: &mut Value, step: usize, rng: &mut Rng) {
    let Some(items) = body.get_mut("input").and_then(Value::as_array_mut) else {
        return;
    };
    let call_id = format!("call_{}", rng.alnum(24));
    let opaque = 1_200 + rng.below(1_600);
    items.push(json!({
        "type": "reasoning",
        "summary": [],
        "content": null,
        "encrypted_content": format!("gAAAAA{}", rng.base64(opaque)),
    }));
    if step % 5 == 4 {
        let ms = 1_000 * (1 + rng.below(30));
        let lines = 20 + rng.below(40);
        items.push(json!({
            "type": "function_call",
            "name": "wait",
            "arguments": json!({"ms": ms}).to_string(),
            "call_id": call_id,
        }));
        items.push(json!({
            "type": "function_call_output",
            "call_id": call_id,
            "output": format!(
                "Process exited with code 0\nWall time: {}.{} seconds\nOutput:\n{}",
                ms / 1_000,
                rng.below(10),
                test_output(rng, lines)
            ),
        }));
        return;
    }
    let path = rng.path();
    let (start, len) = (1 + 200 * rng.below(3), 60 + rng.below(140));
    let cmd = format!("sed -n '{start},{}p' {path}", start + len - 1);
    items.push(json!({
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": call_id,
        "name": "exec",
        "input": format!(
            "const r = await tools.exec_command({{cmd: {}, workdir: \"/home/user/work\"}});\ntext(r.output);",
            Value::String(cmd)
        ),
    }));
    items.push(json!({
        "type": "custom_tool_call_output",
        "call_id": call_id,
        "output": format!(
            "Chunk ID: {}\nWall time: 0.0{} seconds\nProcess exited with code 0\nOutput:\n{}",
            rng.alnum(6),
            rng.below(90) + 10,
            source(rng, len)
        ),
    }));
}

/// Lines numbered as Claude Code's `Read` shows them.
fn numbered(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for (i, line) in text.lines().enumerate() {
        out.push_str(&format!("{:>6}\t{line}\n", i + 1));
    }
    out
}

/// `lines` lines of Rust-like source.
fn source(rng: &mut Rng, lines: u64) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for _ in 0..lines {
        let indent = "    ".repeat(depth);
        let line = match rng.below(10) {
            0 if depth < 3 => {
                depth += 1;
                format!(
                    "{indent}pub fn {}(&self, {}: &{}) -> Result<{}, Error> {{",
                    rng.ident(),
                    rng.ident(),
                    rng.type_name(),
                    rng.type_name()
                )
            }
            1 if depth > 0 => {
                depth -= 1;
                format!("{}}}", "    ".repeat(depth))
            }
            2 => format!(
                "{indent}// {} {} {} the {}.",
                rng.word(),
                rng.word(),
                rng.word(),
                rng.ident()
            ),
            3 => format!(
                "{indent}if {}.{}() > {} {{ return Err(Error::{}); }}",
                rng.ident(),
                rng.ident(),
                rng.below(100_000),
                rng.type_name()
            ),
            4 => format!(
                "{indent}use crate::{}::{{{}, {}}};",
                rng.ident(),
                rng.type_name(),
                rng.type_name()
            ),
            _ => format!(
                "{indent}let {} = {}.{}(&{}, {})?;",
                rng.ident(),
                rng.ident(),
                rng.ident(),
                rng.ident(),
                rng.below(4_096)
            ),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `grep -rn` output.
fn grep_output(rng: &mut Rng, lines: u64) -> String {
    let mut out = String::new();
    for _ in 0..lines {
        out.push_str(&format!(
            "{}:{}:    let {} = {}.{}()?;\n",
            rng.path(),
            1 + rng.below(900),
            rng.ident(),
            rng.ident(),
            rng.ident()
        ));
    }
    out
}

/// `cargo test` output.
fn test_output(rng: &mut Rng, lines: u64) -> String {
    let mut out = String::from("running tests\n");
    for _ in 0..lines {
        out.push_str(&format!(
            "test {}::tests::{}_{} ... ok\n",
            rng.ident(),
            rng.ident(),
            rng.ident()
        ));
    }
    out.push_str(&format!("\ntest result: ok. {lines} passed; 0 failed\n"));
    out
}

const WORDS: [&str; 32] = [
    "request", "budget", "stream", "token", "bucket", "settle", "reserve", "lease", "upstream",
    "header", "answer", "usage", "refill", "scope", "tenant", "limit", "count", "cache", "parse",
    "route", "store", "config", "window", "retry", "error", "state", "client", "model", "body",
    "reader", "writer", "batch",
];

const TYPES: [&str; 12] = [
    "Budget",
    "Stream",
    "Lease",
    "Upstream",
    "Answer",
    "Usage",
    "Scope",
    "Tenant",
    "Config",
    "Store",
    "Request",
    "Reservation",
];

/// SplitMix64: small, seeded, the same on every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn word(&mut self) -> &'static str {
        WORDS[self.below(WORDS.len() as u64) as usize]
    }

    fn type_name(&mut self) -> &'static str {
        TYPES[self.below(TYPES.len() as u64) as usize]
    }

    fn ident(&mut self) -> String {
        format!("{}_{}", self.word(), self.word())
    }

    fn path(&mut self) -> String {
        format!("src/{}/{}.rs", self.word(), self.ident())
    }

    fn pick(&mut self, alphabet: &[u8], n: u64) -> String {
        (0..n)
            .map(|_| alphabet[self.below(alphabet.len() as u64) as usize] as char)
            .collect()
    }

    fn alnum(&mut self, n: u64) -> String {
        self.pick(
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
            n,
        )
    }

    fn base64(&mut self, n: u64) -> String {
        self.pick(
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
            n,
        )
    }
}

/// The members of `body` other than the conversation (for a check that
/// growing leaves them alone).
#[allow(dead_code)] // the test's, not the example's
pub fn fixed_members(body: &Value) -> Map<String, Value> {
    body.as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "messages" | "input"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}
