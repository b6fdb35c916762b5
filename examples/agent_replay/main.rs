//! Writes the agent turns `MODE=agent scripts/instructions.sh` replays:
//! each recorded first turn of `tests/fixtures/agent_turns/` grown to
//! about 15k, 30k and 60k input tokens ([`turns`]), its model renamed to
//! the script's entry for its API (`claude-test`, `gpt-4o-mini`: o200k_base,
//! token ratio 1000, as estimated here).
//!
//! ```text
//! cargo run --release --example agent_replay -- OUT_DIR
//! ```
//!
//! Writes `OUT_DIR/<recording>-<target>.json` and prints one line per
//! turn, tab-separated: file, API path, target, input estimate, bytes,
//! steps appended.

mod turns;

use std::path::{Path, PathBuf};

use serde_json::Value;

use turns::{grow, input_tokens, Cli, TARGETS};

fn main() {
    let Some(out) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: agent_replay OUT_DIR");
        std::process::exit(2);
    };
    if let Err(e) = run(&out) {
        eprintln!("agent_replay: {e}");
        std::process::exit(1);
    }
}

fn run(out: &Path) -> Result<(), String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agent_turns");
    let manifest = read_json(&dir.join("recorded.json"))?;
    let entries = manifest
        .as_object()
        .ok_or("recorded.json is not an object")?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    for (file, entry) in entries {
        let request = entry["request"].as_str().unwrap_or_default();
        let cli = Cli::of_request(request)
            .ok_or_else(|| format!("{file}: an unexpected request {request}"))?;
        let (path, model) = match cli {
            Cli::ClaudeCode => ("/v1/messages?beta=true", "claude-test"),
            Cli::Codex => ("/v1/responses", "gpt-4o-mini"),
        };
        let mut recorded = read_json(&dir.join(file))?;
        recorded["model"] = Value::from(model);
        let stem = file.trim_end_matches(".json");
        for target in TARGETS {
            let turn = grow(&recorded, cli, target, &|b| input_tokens(cli, b))
                .ok_or_else(|| format!("{file}: {target} tokens not reached"))?;
            let text = serde_json::to_string(&turn.body).map_err(|e| e.to_string())?;
            let name = format!("{stem}-{}k.json", target / 1_000);
            std::fs::write(out.join(&name), &text).map_err(|e| format!("{name}: {e}"))?;
            println!(
                "{name}\t{path}\t{target}\t{}\t{}\t{}",
                turn.input_tokens,
                text.len(),
                turn.steps
            );
        }
    }
    Ok(())
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}
