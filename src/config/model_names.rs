//! Model name patterns: a `[[models]]` name, or an entry of a
//! key's `allowed_models`, is an exact name (`gpt-4o-mini`), a prefix
//! ending in one `*` (`claude-*`, `gpt-5*`), or `*` alone (every name).
//! A name a client sends resolves to the entry named exactly so, else to
//! the entry with the longest matching prefix. Coding agents pin model
//! names that change with every release (Claude Code's default, Codex's
//! default); one pattern entry serves them all, with one set of budgets,
//! limits, prices and metric labels (the entry's), so a client cannot
//! mint new budgets by inventing names.

use foldhash::HashMap;

/// One parsed name: what it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamePattern {
    /// Exactly this name.
    Exact(String),
    /// Every name starting with this prefix (`claude-*` → `claude-`; `*` → ``).
    Prefix(String),
}

/// Why a name is not a valid pattern.
pub const BAD_PATTERN: &str = "a `*` may only end a name (`claude-*`) or stand alone (`*`), once";

impl NamePattern {
    /// Parses `name`: `Err` when a `*` is anywhere but at its end, or
    /// appears twice.
    pub fn parse(name: &str) -> Result<NamePattern, &'static str> {
        match name.find('*') {
            None => Ok(NamePattern::Exact(name.to_string())),
            Some(at) if at + 1 == name.len() => Ok(NamePattern::Prefix(name[..at].to_string())),
            Some(_) => Err(BAD_PATTERN),
        }
    }

    /// Whether the name a client sent matches.
    pub fn matches(&self, sent: &str) -> bool {
        match self {
            NamePattern::Exact(n) => n == sent,
            NamePattern::Prefix(p) => sent.starts_with(p.as_str()),
        }
    }

    /// Whether this is a pattern (matches more than one name).
    pub fn is_pattern(&self) -> bool {
        matches!(self, NamePattern::Prefix(_))
    }
}

/// The models of a policy by name: exact names (pattern entries' own
/// names among them, so that a stored record naming `claude-*` finds its
/// entry), then prefixes, longest first.
#[derive(Debug, Clone, Default)]
pub struct ModelIndex {
    /// foldhash: the request's model is looked up on every request.
    exact: HashMap<String, usize>,
    /// `(prefix, model)`, longest prefix first: the first that matches wins.
    prefixes: Vec<(String, usize)>,
}

impl ModelIndex {
    /// Adds entry `i` named `name` (already parsed as `pattern`); `false`
    /// when the name is taken.
    pub fn insert(&mut self, name: &str, pattern: &NamePattern, i: usize) -> bool {
        if self.exact.contains_key(name) {
            return false;
        }
        self.exact.insert(name.to_string(), i);
        if let NamePattern::Prefix(p) = pattern {
            let at = self
                .prefixes
                .iter()
                .position(|(q, _)| q.len() < p.len())
                .unwrap_or(self.prefixes.len());
            self.prefixes.insert(at, (p.clone(), i));
        }
        true
    }

    /// The entry serving `sent`: the exact entry, else the longest prefix.
    pub fn resolve(&self, sent: &str) -> Option<usize> {
        if let Some(&i) = self.exact.get(sent) {
            return Some(i);
        }
        self.prefixes
            .iter()
            .find(|(p, _)| sent.starts_with(p.as_str()))
            .map(|&(_, i)| i)
    }

    /// Whether an entry is named exactly `name` (patterns by their own name).
    pub fn contains(&self, name: &str) -> bool {
        self.exact.contains_key(name)
    }
}

impl super::Policy {
    /// One line per pattern entry for `check-config`: what it serves and
    /// what goes upstream.
    pub fn model_pattern_notes(&self) -> Vec<String> {
        self.models
            .iter()
            .enumerate()
            .filter(|(_, m)| m.pattern)
            .map(|(i, m)| {
                let prefix = m.name.trim_end_matches('*');
                let serves = if prefix.is_empty() {
                    "every name no other entry serves".to_string()
                } else {
                    format!("names starting with {prefix:?} that no exact entry or longer pattern serves")
                };
                let upstream = if m.renamed {
                    format!("sent upstream as {:?}", m.upstream_model)
                } else {
                    "sent upstream as the client named them".to_string()
                };
                format!(
                    "models[{i}] {:?}: a pattern: serves {serves}, {upstream}; one set of budgets, limits, prices and metric labels (under {:?}) for all of them",
                    m.name, m.name
                )
            })
            .collect()
    }

    /// How the name a client sends resolves: the entry serving it and the
    /// name sent upstream, as `budgetgate estimate` prints it.
    pub fn describe_resolution(&self, sent: &str) -> Option<String> {
        let m = self.model(sent)?;
        let upstream = if m.pattern && !m.renamed {
            sent
        } else {
            m.upstream_model.as_str()
        };
        Some(if m.name == sent {
            format!("{sent} (sent upstream as {upstream})")
        } else {
            format!("{sent} → entry {:?} (sent upstream as {upstream})", m.name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(names: &[&str]) -> ModelIndex {
        let mut ix = ModelIndex::default();
        for (i, n) in names.iter().enumerate() {
            assert!(ix.insert(n, &NamePattern::parse(n).unwrap(), i));
        }
        ix
    }

    #[test]
    fn exact_wins_then_the_longest_prefix() {
        let ix = index(&[
            "*",
            "claude-*",
            "claude-opus-*",
            "claude-opus-4-8",
            "gpt-5*",
        ]);
        assert_eq!(ix.resolve("claude-opus-4-8"), Some(3));
        assert_eq!(ix.resolve("claude-opus-4-9"), Some(2));
        assert_eq!(ix.resolve("claude-sonnet-4-5"), Some(1));
        assert_eq!(ix.resolve("gpt-5"), Some(4));
        assert_eq!(ix.resolve("gpt-5.5-codex"), Some(4));
        assert_eq!(ix.resolve("llama"), Some(0));
        // A stored record names the entry itself.
        assert_eq!(ix.resolve("claude-*"), Some(1));
        let no_catch_all = index(&["claude-*"]);
        assert_eq!(no_catch_all.resolve("gpt-4o"), None);
        assert_eq!(
            no_catch_all.resolve("claude"),
            None,
            "the prefix is `claude-`"
        );
    }

    #[test]
    fn a_star_only_ends_a_name_once() {
        assert_eq!(
            NamePattern::parse("gpt-5*"),
            Ok(NamePattern::Prefix("gpt-5".into()))
        );
        assert_eq!(
            NamePattern::parse("*"),
            Ok(NamePattern::Prefix(String::new()))
        );
        assert_eq!(
            NamePattern::parse("gpt-4o"),
            Ok(NamePattern::Exact("gpt-4o".into()))
        );
        for bad in ["cl*ude", "*-mini", "gpt-**", "**", "a*b*"] {
            assert_eq!(NamePattern::parse(bad), Err(BAD_PATTERN), "{bad}");
        }
        assert!(NamePattern::parse("gpt-5*").unwrap().matches("gpt-5.5"));
        assert!(!NamePattern::parse("gpt-5*").unwrap().matches("gpt-4o"));
        assert!(NamePattern::parse("*").unwrap().matches(""));
    }

    #[test]
    fn a_name_is_taken_once() {
        let mut ix = index(&["claude-*"]);
        assert!(!ix.insert("claude-*", &NamePattern::Prefix("claude-".into()), 1));
        assert_eq!(ix.resolve("claude-x"), Some(0));
    }

    /// Fault: a key's `allowed_models` knew exact names only, so a key
    /// could not be given a family of names (nor kept from one).
    #[test]
    fn allowed_models_match_the_name_sent_with_the_same_syntax() {
        let text = r#"
[[upstreams]]
name = "u"
base_url = "http://127.0.0.1:9/v1"
[[models]]
name = "*"
upstreams = ["u"]
[[models]]
name = "gpt-4o"
upstreams = ["u"]
[[tenants]]
name = "t"
keys = [{ id = "k", sha256 = "0000000000000000000000000000000000000000000000000000000000000000" }]
"#;
        let mut raw: crate::config::raw::RawConfig = toml::from_str(text).unwrap();
        raw.tenants[0].keys[0].terms.allowed_models = Some(vec![
            "gpt-5*".into(),
            "gpt-4o".into(),
            "gone-model".into(),
            "bad*pattern".into(),
        ]);
        let p = crate::config::Policy::from_raw(raw, "v".into()).unwrap();
        let key = &p.tenants[0].keys[0];
        assert!(key.allows("gpt-5.5-codex"));
        assert!(key.allows("gpt-4o"));
        assert!(!key.allows("gpt-4o-mini"), "served by `*`, not allowed");
        // An exact name is kept while an entry serves it (here `*` does);
        // a malformed pattern is dropped.
        assert!(key.allows("gone-model"));
        assert_eq!(key.allowed_models.as_ref().map(Vec::len), Some(3));
    }
}
