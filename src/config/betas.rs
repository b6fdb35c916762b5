//! Which `anthropic-beta` values a Messages model passes upstream.
//! Claude Code sends five to eight dated betas with every
//! request, and new ones with each release; refusing every beta not
//! listed made the agent fail as shipped. So by default a beta goes
//! upstream, except the ones that reach provider objects or bill outside
//! the tokens ([`DEFAULT_DENY`]: the Files API, code execution, the MCP
//! connector, skills), a list an operator extends per model
//! (`anthropic_betas_deny`). A model that lists `anthropic_betas` keeps
//! that allow list instead. A beta never lifts a body check (server
//! tools, `mcp_servers`, `container`, `file_id` sources are refused by
//! the body, whatever the header says), and is never a metric label.
//!
//! The policy and its check live here, with the model's settings; the
//! header's handling and the refusal's message are
//! `dialects::anthropic::betas`'.

/// Betas refused unless the model's allow list names them: each reaches
/// provider objects (files, containers, skills) or work billed beside the
/// tokens (code execution, remote MCP servers).
pub const DEFAULT_DENY: &[&str] = &[
    "files-api-*",
    "code-execution-*",
    "mcp-client-*",
    "skills-*",
];

/// One entry of a beta list: an exact value, or a prefix ending in `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BetaRule {
    text: String,
    prefix: bool,
}

impl BetaRule {
    /// Parses `rule`: a `*` may only end it, once.
    pub fn parse(rule: &str) -> Result<BetaRule, &'static str> {
        match rule.find('*') {
            None => Ok(BetaRule {
                text: rule.to_string(),
                prefix: false,
            }),
            Some(at) if at + 1 == rule.len() && at > 0 => Ok(BetaRule {
                text: rule[..at].to_string(),
                prefix: true,
            }),
            Some(_) => Err("a `*` may only end a beta (`files-api-*`), once, after a prefix"),
        }
    }

    /// Whether `beta` matches.
    pub fn matches(&self, beta: &str) -> bool {
        if self.prefix {
            beta.starts_with(self.text.as_str())
        } else {
            beta == self.text
        }
    }
}

impl std::fmt::Display for BetaRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)?;
        if self.prefix {
            f.write_str("*")?;
        }
        Ok(())
    }
}

/// A model's beta policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BetaPolicy {
    /// Only these pass (`anthropic_betas`).
    Allow(Vec<BetaRule>),
    /// Every beta passes but these ([`DEFAULT_DENY`] and `anthropic_betas_deny`).
    Deny(Vec<BetaRule>),
}

impl Default for BetaPolicy {
    fn default() -> Self {
        BetaPolicy::Deny(default_deny())
    }
}

/// [`DEFAULT_DENY`], parsed.
pub fn default_deny() -> Vec<BetaRule> {
    DEFAULT_DENY
        .iter()
        .filter_map(|r| BetaRule::parse(r).ok())
        .collect()
}

/// Why a beta is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BetaRefusal {
    /// Not on the model's allow list.
    NotAllowed,
    /// On the deny list, by this rule.
    Denied(String),
}

impl BetaPolicy {
    /// Whether `beta` may go upstream.
    pub fn check(&self, beta: &str) -> Result<(), BetaRefusal> {
        match self {
            BetaPolicy::Allow(allow) if allow.iter().any(|r| r.matches(beta)) => Ok(()),
            BetaPolicy::Allow(_) => Err(BetaRefusal::NotAllowed),
            BetaPolicy::Deny(deny) => match deny.iter().find(|r| r.matches(beta)) {
                Some(rule) => Err(BetaRefusal::Denied(rule.to_string())),
                None => Ok(()),
            },
        }
    }

    /// Whether some beta starting with `prefix` may go upstream (e.g. a
    /// long-context beta, which `check-config` weighs against the prices).
    pub fn passes_some(&self, prefix: &str) -> bool {
        match self {
            BetaPolicy::Allow(allow) => allow.iter().any(|r| r.text.starts_with(prefix)),
            BetaPolicy::Deny(deny) => !deny
                .iter()
                .any(|r| r.prefix && prefix.starts_with(r.text.as_str())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_default_every_beta_passes_but_the_denied_families() {
        let p = BetaPolicy::default();
        for ok in [
            "claude-code-20250219",
            "context-1m-2025-08-07",
            "interleaved-thinking-2025-05-14",
            "token-counting-2024-11-01",
        ] {
            assert_eq!(p.check(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            p.check("files-api-2025-04-14"),
            Err(BetaRefusal::Denied("files-api-*".into()))
        );
        assert!(p.check("code-execution-2025-08-25").is_err());
        assert!(p.check("mcp-client-2025-11-20").is_err());
        assert!(p.check("skills-2025-10-02").is_err());
        assert!(p.passes_some("context-1m-"));
    }

    #[test]
    fn an_allow_list_keeps_its_meaning() {
        let p = BetaPolicy::Allow(vec![BetaRule::parse("claude-code-20250219").unwrap()]);
        assert_eq!(p.check("claude-code-20250219"), Ok(()));
        assert_eq!(
            p.check("context-1m-2025-08-07"),
            Err(BetaRefusal::NotAllowed)
        );
        assert!(!p.passes_some("context-1m-"));
    }

    #[test]
    fn rules_take_one_trailing_star() {
        assert!(BetaRule::parse("a-*").unwrap().matches("a-b"));
        assert!(BetaRule::parse("*").is_err());
        assert!(BetaRule::parse("a*b").is_err());
        assert!(BetaRule::parse("a**").is_err());
        assert_eq!(BetaRule::parse("x-*").unwrap().to_string(), "x-*");
    }
}
