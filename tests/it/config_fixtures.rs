//! Config validation, envoy style: one small file per message under
//! `tests/config_fixtures/`, each naming the message it provokes
//! (`# message: <the template as written in the source>`) and every error
//! the whole file must produce, exactly and in order
//! (`# expect: <path>: <message>`).
//!
//! The messages are enumerated from the source: every `err(path, message)`
//! call of `src/config/` and of `[server.tls]` validation (`src/tls.rs`).
//! A message without a fixture, or a fixture naming a message the source
//! no longer has, fails the test. The shipped `config/*.toml` are asserted
//! valid.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::support::repo_path;

use budgetgate::config::Policy;

/// One fixture file.
struct Fixture {
    name: String,
    /// The message template it provokes, as written in the source.
    message: String,
    /// Every error the file produces, in order.
    expect: Vec<String>,
    text: String,
}

fn fixtures() -> Vec<Fixture> {
    let dir = repo_path("tests/config_fixtures");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read fixture");
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let header = |tag: &str| -> Vec<String> {
                text.lines()
                    .filter_map(|l| l.strip_prefix(tag))
                    .map(str::to_string)
                    .collect()
            };
            let message = header("# message: ");
            assert_eq!(
                message.len(),
                1,
                "{name}: needs exactly one `# message:` line"
            );
            let expect = header("# expect: ");
            assert!(!expect.is_empty(), "{name}: needs `# expect:` lines");
            Fixture {
                name,
                message: message.into_iter().next().unwrap(),
                expect,
                text,
            }
        })
        .collect()
}

#[test]
fn every_fixture_produces_exactly_its_messages_with_their_paths() {
    let fixtures = fixtures();
    assert!(fixtures.len() >= 37, "only {} fixtures", fixtures.len());
    for f in &fixtures {
        match Policy::from_toml(&f.text) {
            Ok(_) => panic!(
                "{}: the config was accepted; expected {:?}",
                f.name, f.expect
            ),
            Err(e) => assert_eq!(e.0, f.expect, "{}: errors differ", f.name),
        }
    }
}

/// A message-producing call found in the source.
#[derive(Debug)]
struct Site {
    file: String,
    /// The message's string literal (a `format!` template or plain text).
    template: String,
    formatted: bool,
}

/// The source with `//` comments blanked out (string literals kept).
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            out.push(c);
            match c {
                '\\' => out.extend(chars.next()),
                '"' => in_str = false,
                _ => {}
            }
        } else if c == '"' {
            in_str = true;
            out.push(c);
        } else if c == '\'' {
            // A char literal such as '"' or '{' must not open a string.
            out.push(c);
            let rest: String = chars.clone().take(3).collect();
            if let Some(end) = rest.find('\'') {
                if end > 0 {
                    for _ in 0..=end {
                        out.extend(chars.next());
                    }
                }
            }
        } else if c == '/' && chars.peek() == Some(&'/') {
            for c in chars.by_ref() {
                if c == '\n' {
                    out.push('\n');
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The arguments of the call whose `(` is at `open`, split at top-level commas.
fn call_args(src: &str, open: usize) -> Vec<String> {
    let mut args = vec![String::new()];
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    for c in src[open..].chars() {
        if in_str {
            args.last_mut().unwrap().push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' | '[' | '{' => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    // A trailing comma leaves an empty last argument.
                    if args.last().is_some_and(|a| a.trim().is_empty()) {
                        args.pop();
                    }
                    return args;
                }
            }
            ',' if depth == 1 => {
                args.push(String::new());
                continue;
            }
            _ => {}
        }
        args.last_mut().unwrap().push(c);
    }
    panic!("unbalanced call at byte {open}");
}

/// The first string literal in `arg`, unescaped as Rust does (a `\\` at
/// the end of a line drops the line break and the next line's indent).
fn first_literal(arg: &str) -> Option<String> {
    let start = arg.find('"')?;
    let mut out = String::new();
    let mut chars = arg[start + 1..].chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') => {
                    while chars.peek().is_some_and(|c| c.is_whitespace()) {
                        chars.next();
                    }
                }
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => {}
            },
            '"' => return Some(out),
            c => out.push(c),
        }
    }
    None
}

/// Every `err(path, message)` call in `src/config/**` and `src/tls.rs`.
/// Calls that forward a message they were given (no literal) are listed
/// in `FORWARDERS`; any other call without a literal fails the test.
fn message_sites() -> Vec<Site> {
    // `[server.tls]` validation reports through `|p, m| v.err(p, m)`.
    const FORWARDERS: &[&str] = &["p"];
    let mut files = vec![repo_path("src/tls.rs")];
    let mut dirs = vec![repo_path("src/config")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).expect("read src/config") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut sites = Vec::new();
    for file in files {
        let src = strip_comments(&std::fs::read_to_string(&file).expect("read source"));
        let rel = file
            .strip_prefix(repo_path(""))
            .unwrap()
            .display()
            .to_string();
        for (at, _) in src.match_indices("err(") {
            let before = src[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // map_err(, is_err(
            }
            if src[..at].trim_end().ends_with("fn") {
                continue; // the definition
            }
            let args = call_args(&src, at + 3);
            assert_eq!(
                args.len(),
                2,
                "{rel}: err( with {} arguments: {args:?}",
                args.len()
            );
            let message = args[1].trim();
            match first_literal(message) {
                Some(template) => sites.push(Site {
                    file: rel.clone(),
                    template,
                    formatted: message.starts_with("format!"),
                }),
                None => assert!(
                    FORWARDERS.contains(&args[0].trim()),
                    "{rel}: a message without a literal ({message}); give it a fixture-checkable text"
                ),
            }
        }
    }
    sites
}

/// `template` as a regex-free matcher: literal pieces in order, each
/// `{…}` placeholder of a `format!` template matching any non-empty text.
fn matches_template(text: &str, template: &str, formatted: bool) -> bool {
    if !formatted {
        return text == template;
    }
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').expect("closed placeholder") + open;
        pieces.push(&rest[..open]);
        rest = &rest[close + 1..];
    }
    pieces.push(rest);
    let mut at = 0;
    for (i, piece) in pieces.iter().enumerate() {
        if i == 0 {
            if !text.starts_with(piece) {
                return false;
            }
            at = piece.len();
        } else if i == pieces.len() - 1 {
            return text.len() > at && text[at + 1..].ends_with(piece);
        } else {
            match text[at + 1..].find(piece) {
                Some(p) => at = at + 1 + p + piece.len(),
                None => return false,
            }
        }
    }
    at == text.len()
}

#[test]
fn every_message_config_can_produce_has_a_fixture() {
    let sites = message_sites();
    assert!(
        sites.len() >= 43,
        "found only {} message sites: is the scan still finding them?",
        sites.len()
    );
    let mut per_template: BTreeMap<&str, (usize, bool, Vec<&str>)> = BTreeMap::new();
    for s in &sites {
        let e = per_template.entry(&s.template).or_default();
        e.0 += 1;
        e.1 = s.formatted;
        e.2.push(&s.file);
    }
    let fixtures = fixtures();
    let mut missing = Vec::new();
    for (template, (count, formatted, files)) in &per_template {
        let covering: Vec<&Fixture> = fixtures.iter().filter(|f| f.message == *template).collect();
        // A message written at several places needs a fixture for each.
        if covering.len() < *count {
            missing.push(format!(
                "{template:?} ({count} site(s) in {files:?}, {} fixture(s))",
                covering.len()
            ));
        }
        for f in covering {
            let shown = f.expect.iter().any(|line| {
                line.split_once(": ")
                    .is_some_and(|(_, msg)| matches_template(msg, template, *formatted))
            });
            assert!(shown, "{}: no expected line shows {template:?}", f.name);
        }
    }
    assert!(
        missing.is_empty(),
        "messages without enough fixtures:\n  {}",
        missing.join("\n  ")
    );
    for f in &fixtures {
        assert!(
            per_template.contains_key(f.message.as_str()),
            "{}: names {:?}, which src/config/ no longer produces",
            f.name,
            f.message
        );
    }
}

#[test]
fn the_template_matcher_matches_what_it_should() {
    assert!(matches_template(
        "unknown model \"m\"",
        "unknown model {model:?}",
        true
    ));
    assert!(!matches_template(
        "unknown model ",
        "unknown model {model:?}",
        true
    ));
    assert!(matches_template(
        "must be ≤ max_output_tokens (100)",
        "must be ≤ max_output_tokens ({max_out})",
        true
    ));
    assert!(matches_template(
        "\"x\" cannot be forwarded",
        "{h:?} cannot be forwarded",
        true
    ));
    assert!(!matches_template("must be ≤ 5", "must be > 0", false));
    assert!(matches_template(
        "must match [A-Za-z0-9._-]{1,64}",
        "must match [A-Za-z0-9._-]{1,64}",
        false
    ));
}

fn shipped_configs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo_path("config"))
        .expect("config/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    v
}

#[test]
fn the_shipped_configs_are_valid() {
    let configs = shipped_configs();
    assert!(configs.len() >= 2, "{configs:?}");
    for path in configs {
        let text = std::fs::read_to_string(&path).expect("read config");
        // The upstream keys the shipped files name come from the environment:
        // give the unset ones a value (only this test reads them).
        let raw: toml::Value = toml::from_str(&text).expect("TOML");
        let vars = raw
            .get("upstreams")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|u| u.get("api_key_env").and_then(toml::Value::as_str));
        for var in vars {
            if std::env::var_os(var).is_none() {
                std::env::set_var(var, "sk-shipped-config-check");
            }
        }
        // The end-user examples read the default variable.
        crate::support::end_user_key();
        if let Err(e) = Policy::load(Path::new(&path)) {
            panic!("{} is invalid:\n{e}", path.display());
        }
    }
}

/// The shipped configs' comments start the binaries the README builds:
/// `cargo run` would start a separate debug build (minutes of compiling,
/// and a slow gateway).
#[test]
fn the_shipped_configs_start_the_built_binaries() {
    for path in shipped_configs() {
        let text = std::fs::read_to_string(&path).expect("read config");
        for (i, line) in text.lines().enumerate() {
            assert!(
                !line.contains("cargo run"),
                "{}:{}: names `cargo run`; name target/release/budgetgate: {line}",
                path.display(),
                i + 1
            );
        }
    }
}

/// Every shipped agent config (Codex on `local.toml`, Claude Code on
/// `local-anthropic.toml` and `bedrock.toml`) reserves the expected output
/// with a `max_exposure` it states: a thinking turn's whole cap would
/// otherwise be reserved (~145k for Claude Code's 128000).
#[test]
fn every_shipped_agent_config_reserves_the_expected_output_with_a_stated_exposure() {
    for file in ["local.toml", "local-anthropic.toml", "bedrock.toml"] {
        let text = std::fs::read_to_string(repo_path(&format!("config/{file}"))).expect("config");
        let raw: toml::Value = toml::from_str(&text).expect("TOML");
        let tenants = raw["tenants"].as_array().expect("tenants");
        let agents: Vec<&toml::Value> = tenants
            .iter()
            .filter(|t| matches!(t["name"].as_str(), Some("demo" | "coder")))
            .collect();
        assert_eq!(agents.len(), 1, "{file}: its agent tenant");
        for t in agents {
            assert_eq!(
                t.get("output_reservation").and_then(toml::Value::as_str),
                Some("expected"),
                "{file}"
            );
            assert!(
                t.get("max_exposure").is_some(),
                "{file}: max_exposure stated"
            );
        }
    }
}
