//! Every suite runs in a plain `cargo test`: no test source is compiled
//! away by a feature gate and no test target needs a feature, since cargo
//! skips both silently and reports success.

use std::path::{Path, PathBuf};

use crate::support::repo_path;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_test_is_gated_behind_a_feature() {
    let mut files = Vec::new();
    rust_files(&repo_path("tests"), &mut files);
    assert!(files.len() > 10, "{files:?}");
    // Spelled in two pieces so this file does not find itself.
    let gate = ["cfg(", "feature"].concat();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read test source");
        assert!(
            !text.contains(&gate),
            "{} is compiled only with a feature: a plain `cargo test` would skip it",
            f.display()
        );
    }
    let manifest = std::fs::read_to_string(repo_path("Cargo.toml")).expect("Cargo.toml");
    assert!(
        !manifest.contains("required-features"),
        "a target needs a feature: a plain `cargo test` skips it silently"
    );
}

/// A file under `tests/it/` that `main.rs` does not declare compiles to
/// nothing and its tests never run, silently (it happened in a merge).
#[test]
fn every_suite_file_is_a_module_of_the_test_binary() {
    let main = std::fs::read_to_string(repo_path("tests/it/main.rs")).expect("tests/it/main.rs");
    let declared: Vec<&str> = main
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mod "))
        .filter_map(|l| l.strip_suffix(';'))
        .collect();
    let mut files = Vec::new();
    rust_files(&repo_path("tests/it"), &mut files);
    for f in files {
        let name = f.file_stem().and_then(|s| s.to_str()).expect("file name");
        if name == "main" {
            continue;
        }
        assert!(
            declared.contains(&name),
            "tests/it/{name}.rs is not declared in tests/it/main.rs: its tests never run"
        );
    }
}
