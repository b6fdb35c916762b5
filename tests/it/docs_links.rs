//! Every relative link of the README and of `docs/*.md` names a file that
//! exists and, into a Markdown file, a heading it has (GitHub's anchors):
//! the docs index (docs/README.md) and the configuration reference are
//! reached by anchors, and a renamed heading must not leave them dangling.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support::repo_path;

/// GitHub's anchor of a heading: lower case, punctuation dropped except
/// `-` and `_`, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let s = slug(&line[hashes..]);
        let n = seen.entry(s.clone()).or_default();
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

/// `](target)` links of the prose.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![repo_path("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo_path("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn every_relative_link_and_anchor_of_the_docs_resolves() {
    let files = markdown_files();
    let mut headings: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        headings.insert(f.canonicalize().expect("canonical"), anchors(&text));
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        let dir = f.parent().unwrap_or(Path::new("."));
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") || link.contains(' ') {
                continue;
            }
            let (path, fragment) = match link.split_once('#') {
                Some((p, frag)) => (p, Some(frag)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                f.clone()
            } else {
                dir.join(path)
            };
            checked += 1;
            let Ok(target) = target.canonicalize() else {
                broken.push(format!("{}: {link}: no such file", f.display()));
                continue;
            };
            if let (Some(frag), Some(known)) = (fragment, headings.get(&target)) {
                if !known.contains(frag) {
                    broken.push(format!("{}: {link}: no such heading", f.display()));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: the parser is off"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_githubs() {
    let text =
        "# A\n## `[[tenants]]`\n### The memory store's snapshot\n```\n# not a heading\n```\n## A\n";
    let a = anchors(text);
    let want: BTreeSet<String> = ["a", "tenants", "the-memory-stores-snapshot", "a-1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(a, want);
}
