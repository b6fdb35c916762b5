//! What `budgetgate check-config` flags about prices: the combinations of
//! a dollar budget and a model whose requests would be refused as
//! unpriceable (docs/MONEY.md). They are not load errors — the gateway
//! runs and refuses those requests clearly — but an operator should know
//! before a tenant finds out.

use super::{Limits, ModelPolicy, Policy};

impl Policy {
    /// One line per (tenant, model) under an enforced dollar budget that
    /// cannot always be priced: the model has no price on some or every
    /// deployment, or allows tools billed per use.
    pub fn unpriced_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if t.shadow {
                continue;
            }
            let wide = t.limits.has_usd() || t.keys.iter().any(|k| k.limits.has_usd());
            for m in &self.models {
                let scoped = t.model_limits.get(&m.name).is_some_and(Limits::has_usd);
                if !(wide || scoped) {
                    continue;
                }
                for problem in self.unpriced(m) {
                    out.push(format!(
                        "tenants[{i}] ({}) has a dollar budget and model {:?} {problem}",
                        t.name, m.name
                    ));
                }
            }
        }
        out
    }

    /// One line per priced Messages model that passes a long-context beta
    /// (`context-1m-*`) without `price_tiers`: its long requests are priced
    /// at the base price, below what the provider bills above 200k input
    /// tokens. (The tier is chosen by input size, never by the header.)
    pub fn long_context_warnings(&self) -> Vec<String> {
        self.models
            .iter()
            .enumerate()
            .filter(|(_, m)| m.messages && m.anthropic_betas.passes_some("context-1m-"))
            .filter(|(_, m)| {
                let tables = m
                    .upstreams
                    .iter()
                    .filter_map(|&u| m.price_on(&self.upstreams[u]))
                    .collect::<Vec<_>>();
                !tables.is_empty() && tables.iter().any(|t| t.tiers.is_empty())
            })
            .map(|(i, m)| {
                format!(
                    "models[{i}] ({}) passes the long-context beta `context-1m-*` but has no price_tiers: requests above the provider's long-context threshold are priced at the base price (add price_tiers, docs/MONEY.md, or deny the beta with anthropic_betas_deny)",
                    m.name
                )
            })
            .collect()
    }

    /// Why requests of model `m` may be unpriceable.
    fn unpriced(&self, m: &ModelPolicy) -> Vec<String> {
        let mut out = Vec::new();
        let unpriced: Vec<&str> = m
            .upstreams
            .iter()
            .map(|&u| &self.upstreams[u])
            .filter(|u| m.price_on(u).is_none())
            .map(|u| u.name.as_str())
            .collect();
        if unpriced.len() == m.upstreams.len() {
            out.push("has no price: every request of this tenant to it is refused (add `price` to the model)".to_string());
        } else if !unpriced.is_empty() {
            out.push(format!(
                "has no price on deployment(s) {unpriced:?}: this tenant's requests never go there"
            ));
        }
        let unpriced_tools: Vec<&String> = m
            .hosted_tools
            .iter()
            .filter(|n| {
                crate::money::HostedKind::of_tool_type(n)
                    .is_none_or(|k| m.hosted_prices.get(k).is_none())
            })
            .collect();
        if !unpriced_tools.is_empty() {
            out.push(format!(
                "allows hosted tools {unpriced_tools:?}, billed per call: this tenant's requests using them are refused"
            ));
        }
        if m.allow_server_tools {
            out.push("allows server tools, billed per use: this tenant's requests using them are refused".to_string());
        }
        if m.pattern {
            out.push("is a pattern: its one price covers every name it matches (a name priced otherwise needs an exact entry)".to_string());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Policy;

    #[test]
    fn dollar_budgets_over_unpriced_models_are_flagged() {
        let text = r#"
[[upstreams]]
name = "a"
base_url = "http://127.0.0.1:9/v1"
[[upstreams]]
name = "b"
base_url = "http://127.0.0.1:9/v1"
price = { input = "1", output = "2" }
[[models]]
name = "priced"
upstreams = ["a"]
price = { input = "0.15", output = "0.60" }
[[models]]
name = "free"
upstreams = ["a"]
[[models]]
name = "half"
upstreams = ["a", "b"]
[[models]]
name = "tools"
upstreams = ["a"]
price = { input = "0.15", output = "0.60" }
hosted_tools = ["web_search"]
[[tenants]]
name = "payer"
limits = { usd_per_day = "1.00" }
[[tenants]]
name = "scoped"
model_limits = { "half" = { usd_per_month = "5" } }
[[tenants]]
name = "tokens"
limits = { tpm = 1000 }
"#;
        let p = Policy::from_toml(text).unwrap();
        let w = p.unpriced_warnings();
        assert_eq!(w.len(), 4, "{w:#?}");
        assert!(w[0]
            .starts_with("tenants[0] (payer) has a dollar budget and model \"free\" has no price"));
        assert!(w[1].contains("\"half\" has no price on deployment(s) [\"a\"]"));
        assert!(w[2].contains("\"tools\" allows hosted tools [\"web_search\"]"));
        assert!(w[3].starts_with("tenants[1] (scoped) has a dollar budget and model \"half\""));
    }

    /// Fault: a model passing Claude Code's `context-1m-*` beta priced its
    /// long requests at the base price without the operator being told.
    #[test]
    fn a_priced_model_passing_the_long_context_beta_without_tiers_is_flagged() {
        let text = r#"
[[upstreams]]
name = "a"
kind = "anthropic"
base_url = "http://127.0.0.1:9"
[[models]]
name = "claude-*"
upstreams = ["a"]
price = { input = "3", cached_input = "0.30", cache_write_5m = "3.75", cache_write_1h = "6", output = "15" }
[[models]]
name = "claude-denied"
upstreams = ["a"]
price = { input = "3", cached_input = "0.30", cache_write_5m = "3.75", cache_write_1h = "6", output = "15" }
anthropic_betas_deny = ["context-1m-*"]
[[models]]
name = "claude-free"
upstreams = ["a"]
"#;
        let p = Policy::from_toml(text).unwrap();
        let w = p.long_context_warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("models[0] (claude-*) passes the long-context beta"));
    }
}
