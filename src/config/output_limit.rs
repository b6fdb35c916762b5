//! What `budgetgate check-config` notes about output limits: a model
//! without `max_output_tokens` is not a load error (the gateway then
//! invents no limit and the provider answers for its own model), but
//! without `context_window` either its uncapped requests have no known
//! bound, so they are sent their reservation as the cap and cut short
//! there, which an operator may not expect.

use super::Policy;

impl Policy {
    /// One line per model without a configured `max_output_tokens`.
    pub fn output_limit_warnings(&self) -> Vec<String> {
        self.models
            .iter()
            .enumerate()
            .filter(|(_, m)| m.max_output_tokens.is_none())
            .map(|(i, m)| {
                let uncapped = match m.context_window {
                    Some(_) => "a request without a cap is bounded by context_window".to_string(),
                    None => format!(
                        "a request without a cap is sent default_max_output_tokens ({}) as its cap, \
                         its answer cut short there",
                        m.default_max_output_tokens
                    ),
                };
                format!(
                    "models[{i}] ({}) has no max_output_tokens: client caps go upstream unchecked, and {uncapped}",
                    m.name
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_models_without_a_limit_are_named() {
        let policy = crate::config::Policy::from_toml(
            r#"
[[upstreams]]
name = "u"
base_url = "http://127.0.0.1:9/v1"
[[models]]
name = "capped"
upstreams = ["u"]
max_output_tokens = 4096
[[models]]
name = "open"
upstreams = ["u"]
"#,
        )
        .expect("a valid config");
        let w = policy.output_limit_warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("models[1] (open) has no max_output_tokens"),
            "{w:?}"
        );
        assert!(w[0].contains("default_max_output_tokens (1024)"), "{w:?}");
    }
}
