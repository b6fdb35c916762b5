//! The agent turns `MODE=agent scripts/instructions.sh` replays
//! (`examples/agent_replay/`): grown from each recorded first turn to
//! about 15k, 30k and 60k input tokens, deterministically, and estimated
//! the same through the token-count cache as without it.
//!
//! * Growing a recording twice gives the same bytes; each turn reaches its
//!   target with the fewest steps (at least one), keeps the recording's
//!   other members, and ends with the CLI's own result item.
//! * The estimate of every turn (input, cacheable prefix, output) is the
//!   same with the cache cold, warm, and bypassed
//!   (`estimate::cache::uncached`): the cache must never change a figure.

#[path = "../../examples/agent_replay/turns.rs"]
mod turns;

use budgetgate::estimate::cache::uncached;
use serde_json::Value;

use crate::support::repo_path;
use turns::{fixed_members, grow, input_tokens, replay_estimate, Cli, TARGETS};

/// Every recording of `recorded.json` with its CLI.
fn recordings() -> Vec<(String, Cli, Value)> {
    let dir = repo_path("tests/fixtures/agent_turns");
    let read = |f: &str| -> Value {
        let text = std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{f}: {e}"))
    };
    let manifest = read("recorded.json");
    manifest
        .as_object()
        .expect("recorded.json is an object")
        .iter()
        .map(|(file, entry)| {
            let request = entry["request"].as_str().unwrap_or_default();
            let cli = Cli::of_request(request)
                .unwrap_or_else(|| panic!("{file}: an unexpected request {request}"));
            (file.clone(), cli, read(file))
        })
        .collect()
}

#[test]
fn replayed_turns_are_grown_deterministically_to_their_sizes() {
    let all = recordings();
    assert!(
        all.iter().any(|r| r.1 == Cli::ClaudeCode) && all.iter().any(|r| r.1 == Cli::Codex),
        "a recording of each CLI"
    );
    for (file, cli, recorded) in &all {
        for target in TARGETS {
            let estimate = |b: &Value| input_tokens(*cli, b);
            let turn = grow(recorded, *cli, target, &estimate)
                .unwrap_or_else(|| panic!("{file}: {target} not reached"));
            let again = grow(recorded, *cli, target, &estimate).expect("grown again");
            assert_eq!(
                turn.body, again.body,
                "{file} {target}: the same turn twice"
            );
            assert!(
                turn.input_tokens >= target,
                "{file} {target}: {}",
                turn.input_tokens
            );
            if turn.steps > 1 {
                // The fewest steps: one less stays below the target.
                let mut shorter = recorded.clone();
                for step in 0..turn.steps - 1 {
                    turns::append(&mut shorter, *cli, step);
                }
                assert!(
                    estimate(&shorter) < target,
                    "{file} {target}: a step too many"
                );
            }
            assert_eq!(
                fixed_members(&turn.body),
                fixed_members(recorded),
                "{file} {target}: only the conversation grows"
            );
            let (list, result_types) = match cli {
                Cli::ClaudeCode => ("messages", ["tool_result", "tool_result"]),
                Cli::Codex => ("input", ["custom_tool_call_output", "function_call_output"]),
            };
            let grown = turn.body[list].as_array().expect("a list").len();
            let before = recorded[list].as_array().expect("a list").len();
            assert!(
                grown >= before + 2 * turn.steps,
                "{file} {target}: {grown} items"
            );
            let last = turn.body[list]
                .as_array()
                .and_then(|l| l.last())
                .expect("an item");
            let last_type = match cli {
                Cli::ClaudeCode => last["content"][0]["type"].as_str(),
                Cli::Codex => last["type"].as_str(),
            };
            assert!(
                last_type.is_some_and(|t| result_types.contains(&t)),
                "{file} {target}: ends with {last_type:?}"
            );
        }
    }
}

#[test]
fn the_token_count_cache_never_changes_a_replayed_turns_estimate() {
    for (file, cli, recorded) in recordings() {
        for target in TARGETS {
            let turn = grow(&recorded, cli, target, &|b| input_tokens(cli, b))
                .unwrap_or_else(|| panic!("{file}: {target} not reached"));
            let reference = uncached(|| replay_estimate(cli, &turn.body))
                .unwrap_or_else(|e| panic!("{file} {target}: {e}"));
            // Growing counted this turn's strings through the cache (the
            // last step's cold, the rest warm): warm now, twice.
            for round in 0..2 {
                let cached = replay_estimate(cli, &turn.body).expect("estimated");
                assert_eq!(cached, reference, "{file} {target}, round {round}");
            }
            assert_eq!(reference.input_tokens, turn.input_tokens, "{file} {target}");
            assert!(reference.input_tokens >= target);
        }
    }
}
