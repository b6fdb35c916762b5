//! The house (DESIGN §9): the top-level modules of `src/` stand
//! on floors, and an import may point only down a floor, or sideways to a
//! neighbour the floor table names. The check reads every `crate::` path
//! between top-level modules (comments, `#[cfg(test)]` modules and test
//! files left out, as the tests may reach anywhere) and prints modules,
//! edges, pairs that import each other, circles (strongly connected
//! components of more than one module) and edges that point up a floor or
//! to a neighbour the table does not name.
//!
//! `HOUSE_SRC=<dir> cargo test --test it house:: -- --nocapture` checks
//! another tree (an older commit's `src/`) and prints its figures; the
//! floor table is this tree's. A new top-level module must be given a floor
//! here: an unknown module fails the check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support::repo_path;

/// Floors from the bottom (0) up, and for each module the modules of its
/// own floor it may import. Every module may import any module of a lower
/// floor. DESIGN §9 draws the same table.
const FLOORS: &[(&str, u8, &[&str])] = &[
    // The bottom: time, exact money, the shared database handle.
    ("clock", 0, &[]),
    ("money", 0, &[]),
    ("db", 0, &[]),
    // What the admin commands share (token, encoding, errors): no import.
    ("admin_call", 0, &[]),
    // Settings: config/ owns every settings type and imports no feature.
    ("config", 1, &[]),
    // The budget model and its stores; estimation.
    ("budget", 2, &[]),
    ("estimate", 2, &[]),
    // The layers the lifecycle joins. The settlement event sits under its
    // observers; metrics is the recorder every layer may call.
    ("dialects", 3, &[]),
    ("settlement", 3, &["dialects"]),
    ("metrics", 3, &["dialects", "settlement"]),
    ("connections", 3, &["metrics"]),
    ("tls", 3, &["connections"]),
    ("upstreams", 3, &["dialects", "metrics", "admission"]),
    ("queue", 3, &["settlement", "metrics"]),
    ("telemetry", 3, &["settlement", "dialects", "upstreams"]),
    ("control", 3, &["metrics"]),
    (
        "ledger",
        3,
        &["settlement", "dialects", "metrics", "admission"],
    ),
    (
        "alerts",
        3,
        &["settlement", "ledger", "metrics", "upstreams"],
    ),
    ("admission", 3, &["settlement", "dialects", "metrics"]),
    // The gateway's state and budget plan.
    ("gateway", 4, &[]),
    // The request path.
    ("lifecycle", 5, &[]),
    // The HTTP face and the admin CLI.
    ("server", 6, &[]),
    ("admin_cli", 6, &[]),
    // Wiring.
    ("app", 7, &[]),
];

/// Former names of modules (renamed 2026-12-04), so that an older tree
/// read with `HOUSE_SRC` is judged on the same floors.
const FORMER: &[(&str, &str)] = &[("reserve", "budget"), ("reservation", "admission")];

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

/// The text without line comments and without `#[cfg(test)] mod … { … }`
/// blocks (brace matched; braces in strings are rare enough in this code
/// that a miscount would show as a missing or extra edge in review).
fn strip(text: &str) -> String {
    let no_comments: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::with_capacity(no_comments.len());
    let mut rest = no_comments.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        let head = after.trim_start();
        let head = head.strip_prefix("pub(crate)").unwrap_or(head).trim_start();
        let head = head.strip_prefix("pub").unwrap_or(head).trim_start();
        if let Some(m) = head.strip_prefix("mod ") {
            let brace = m.find(['{', ';']).unwrap_or(m.len());
            if m[brace..].starts_with('{') {
                let body = &m[brace + 1..];
                let mut depth = 1usize;
                let mut end = body.len();
                for (j, c) in body.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = j + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &body[end..];
                continue;
            }
        }
        out.push_str("#[cfg(test)]");
        rest = after;
    }
    out.push_str(rest);
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules a source text names through `crate::`.
fn targets(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // `use crate::{a, b::c, d::{e, f}}`: the names at depth 1.
            let mut depth = 1usize;
            let mut expect_name = true;
            let mut j = 0;
            let bytes = group.as_bytes();
            while j < bytes.len() && depth > 0 {
                let c = bytes[j] as char;
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => expect_name = true,
                    c if c.is_whitespace() => {}
                    _ => {
                        if depth == 1 && expect_name {
                            let name = ident_at(&group[j..]);
                            if !name.is_empty() {
                                found.insert(name.to_string());
                                j += name.len();
                                expect_name = false;
                                continue;
                            }
                        }
                        if depth == 1 {
                            expect_name = false;
                        }
                    }
                }
                j += 1;
            }
        } else {
            let name = ident_at(after);
            if !name.is_empty() {
                found.insert(name.to_string());
            }
        }
        rest = after;
    }
    found
}

struct House {
    modules: BTreeSet<String>,
    edges: BTreeMap<String, BTreeSet<String>>,
}

fn read_house(src: &Path) -> House {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let top_level: BTreeSet<String> = std::fs::read_dir(src)
        .expect("src dir")
        .filter_map(|e| {
            let p = e.ok()?.path();
            let name = p.file_name()?.to_str()?.to_string();
            if p.is_dir() {
                Some(name)
            } else {
                name.strip_suffix(".rs").map(str::to_string)
            }
        })
        .filter(|m| m != "main" && m != "lib")
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
        let name = parts.last().copied().unwrap_or_default();
        if name == "tests.rs"
            || name.ends_with("_tests.rs")
            || parts[..parts.len() - 1].contains(&"tests")
        {
            continue;
        }
        let module = parts[0].strip_suffix(".rs").unwrap_or(parts[0]);
        if module == "main" || module == "lib" {
            continue;
        }
        let text = strip(&std::fs::read_to_string(&f).expect("read source"));
        for t in targets(&text) {
            if t != module && top_level.contains(&t) {
                edges.entry(module.to_string()).or_default().insert(t);
            }
        }
    }
    House {
        modules: top_level,
        edges,
    }
}

/// Strongly connected components of more than one module (Tarjan).
fn circles(house: &House) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        if let Some(ws) = t.edges.get(v) {
            for w in ws {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(lw));
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(iw));
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges: &house.edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for m in &house.modules {
        if !t.index.contains_key(m.as_str()) {
            visit(&mut t, m);
        }
    }
    t.out
}

struct Report {
    text: String,
    faults: usize,
}

fn report(house: &House) -> Report {
    let mut floor: BTreeMap<&str, (u8, &[&str])> =
        FLOORS.iter().map(|(m, f, n)| (*m, (*f, *n))).collect();
    for (old, new) in FORMER {
        if house.modules.contains(*old) && !house.modules.contains(*new) {
            if let Some(&entry) = floor.get(new) {
                floor.insert(old, entry);
            }
        }
    }
    let n_edges: usize = house.edges.values().map(BTreeSet::len).sum();
    let mut pairs = Vec::new();
    for (a, bs) in &house.edges {
        for b in bs {
            if a < b && house.edges.get(b).is_some_and(|x| x.contains(a)) {
                pairs.push(format!("{a}<->{b}"));
            }
        }
    }
    let circles = circles(house);
    let mut unknown = Vec::new();
    for m in &house.modules {
        if !floor.contains_key(m.as_str()) {
            unknown.push(m.clone());
        }
    }
    let mut up = Vec::new();
    for (a, bs) in &house.edges {
        let Some(&(fa, neighbours)) = floor.get(a.as_str()) else {
            continue;
        };
        for b in bs {
            let Some(&(fb, _)) = floor.get(b.as_str()) else {
                continue;
            };
            if fb > fa {
                up.push(format!("{a} (floor {fa}) -> {b} (floor {fb}): up a floor"));
            } else if fb == fa && !neighbours.contains(&b.as_str()) {
                up.push(format!(
                    "{a} -> {b} (floor {fa}): a neighbour the table does not name"
                ));
            }
        }
    }
    let largest = circles.iter().map(Vec::len).max().unwrap_or(0);
    let mut text = format!(
        "modules {}, edges {n_edges}, pairs importing each other {}{}\n",
        house.modules.len(),
        pairs.len(),
        if pairs.is_empty() {
            String::new()
        } else {
            format!(": {}", pairs.join(", "))
        }
    );
    text += &format!(
        "circles {} (largest {largest} modules){}\n",
        circles.len(),
        circles
            .iter()
            .map(|c| format!("\n  circle: {}", c.join(", ")))
            .collect::<String>()
    );
    text += &format!("edges up a floor or to an unnamed neighbour {}\n", up.len());
    for u in &up {
        text += &format!("  {u}\n");
    }
    if !unknown.is_empty() {
        text += &format!("modules without a floor: {}\n", unknown.join(", "));
    }
    Report {
        faults: pairs.len() + circles.len() + up.len() + unknown.len(),
        text,
    }
}

#[test]
fn imports_point_down_the_floors() {
    let src = std::env::var_os("HOUSE_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_path("src"));
    let house = read_house(&src);
    assert!(
        house.modules.len() > 10,
        "{}: {:?}",
        src.display(),
        house.modules
    );
    let r = report(&house);
    println!("house of {}:\n{}", src.display(), r.text);
    assert_eq!(r.faults, 0, "the house has faults:\n{}", r.text);
}

#[test]
fn every_floor_in_the_table_names_a_module_of_the_tree() {
    let house = read_house(&repo_path("src"));
    for (m, _, neighbours) in FLOORS {
        assert!(
            house.modules.contains(*m),
            "{m} is in the floor table but not in src/"
        );
        for n in *neighbours {
            let f = FLOORS.iter().find(|x| x.0 == *n).map(|x| x.1);
            let own = FLOORS.iter().find(|x| x.0 == *m).map(|x| x.1);
            assert_eq!(f, own, "{m}'s neighbour {n} is not on its floor");
        }
    }
}

/// The reader finds what the check is about: grouped imports, paths in
/// expressions, test modules left out, a comment never an import.
#[test]
fn the_reader_sees_grouped_and_inline_paths_and_skips_tests_and_comments() {
    let text = strip(
        "use crate::{budget::{self, Scope}, money::Usd,\n  clock};\n\
         fn f() { crate::metrics::render(); }\n\
         // crate::server is only named here\n\
         #[cfg(test)]\nmod tests {\n    use crate::lifecycle::x;\n    fn g() { if true { } }\n}\n\
         fn h() { crate::queue::Class::Batch; }\n",
    );
    let t: Vec<String> = targets(&text).into_iter().collect();
    assert_eq!(t, ["budget", "clock", "metrics", "money", "queue"]);
}

/// A house with a pair, a circle through three modules and an edge up a
/// floor: each is counted.
#[test]
fn pairs_circles_and_upward_edges_are_found() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut add = |a: &str, b: &str| {
        edges.entry(a.into()).or_default().insert(b.into());
    };
    add("budget", "lifecycle"); // up two floors
    add("lifecycle", "budget");
    add("ledger", "alerts"); // a neighbour the table does not name
    add("alerts", "ledger");
    add("budget", "money"); // down a floor: no fault
    let modules = ["budget", "lifecycle", "ledger", "alerts", "money"]
        .into_iter()
        .map(String::from)
        .collect();
    let r = report(&House { modules, edges });
    assert!(
        r.text.contains("pairs importing each other 2"),
        "{}",
        r.text
    );
    assert!(r.text.contains("circles 2"), "{}", r.text);
    assert!(
        r.text.contains("budget (floor 2) -> lifecycle (floor 5)"),
        "{}",
        r.text
    );
    assert!(r.text.contains("ledger -> alerts (floor 3)"), "{}", r.text);
    assert!(!r.text.contains("-> money"), "{}", r.text);
    assert_eq!(r.faults, 2 + 2 + 2, "{}", r.text);
}
