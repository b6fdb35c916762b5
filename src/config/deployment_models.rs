//! Per-deployment model ids: `[[upstreams]] models = {
//! "claude-opus-4-8" = "us.anthropic.claude-opus-4-8-v1:0" }`. Each
//! region or cloud names the same public model by its own id. A key is a
//! public name (an exact `[[models]]` entry, or a name a pattern entry
//! serves: an explicit list) or a pattern entry's own name (`claude-*`)
//! whose value is a template: `{model}` stands for the name that would
//! otherwise go upstream. A deployment with a map that has no id for a
//! request's model is skipped for that request; one without a map sends
//! the model's usual upstream name.

use std::borrow::Cow;
use std::collections::BTreeMap;

/// The `models` map of one deployment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeploymentModels(pub BTreeMap<String, String>);

/// What a template's value holds in place of the model name.
pub const TEMPLATE_NAME: &str = "{model}";

impl DeploymentModels {
    /// The id for a request to public model `public` (an entry's name,
    /// a pattern's included) that would otherwise go upstream as
    /// `default`: `default`'s own entry, else the entry's (a template
    /// filled with `default`), else `None` (the deployment is skipped).
    pub fn id<'a>(&'a self, public: &str, default: &str) -> Option<Cow<'a, str>> {
        if let Some(id) = self.0.get(default) {
            return Some(Cow::Borrowed(id.as_str()));
        }
        let v = self.0.get(public)?;
        if v.contains(TEMPLATE_NAME) {
            Some(Cow::Owned(v.replace(TEMPLATE_NAME, default)))
        } else {
            Some(Cow::Borrowed(v.as_str()))
        }
    }
}

impl super::UpstreamPolicy {
    /// THE model id a request to `model` goes to this deployment as:
    /// `default` is the name it would go upstream as without a map
    /// (`Prepared::upstream_model`). `None`: this deployment has no id for
    /// it and is skipped.
    pub fn model_id<'a>(
        &'a self,
        model: &super::ModelPolicy,
        default: &'a str,
    ) -> Option<Cow<'a, str>> {
        match &self.models {
            None => Some(Cow::Borrowed(default)),
            Some(m) => m.id(&model.name, default),
        }
    }
}

impl super::Policy {
    /// One line per (model, deployment) pair `check-config` should name:
    /// a deployment whose `models` map has no id for an exact model (it is
    /// skipped for it), or serves a pattern entry only for the names it
    /// lists.
    pub fn deployment_model_notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, m) in self.models.iter().enumerate() {
            for &u in &m.upstreams {
                let up = &self.upstreams[u];
                let Some(map) = &up.models else { continue };
                if !m.pattern {
                    if map.id(&m.name, &m.upstream_model).is_none() {
                        out.push(format!(
                            "models[{i}] {:?}: deployment {:?} has no id for it in its `models` map: skipped for this model",
                            m.name, up.name
                        ));
                    }
                } else if !map.0.contains_key(&m.name) {
                    let listed: Vec<&str> = map
                        .0
                        .keys()
                        .filter(|k| k.starts_with(m.name.trim_end_matches('*')))
                        .map(String::as_str)
                        .collect();
                    out.push(format!(
                        "models[{i}] {:?}: deployment {:?} serves only the names its `models` map lists ({}); skipped for any other",
                        m.name,
                        up.name,
                        if listed.is_empty() { "none".to_string() } else { listed.join(", ") }
                    ));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> DeploymentModels {
        DeploymentModels(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn exact_names_templates_and_explicit_lists() {
        let m = map(&[
            ("claude-opus-4-8", "us.anthropic.claude-opus-4-8-v1:0"),
            ("claude-*", "eu.anthropic.{model}-v1:0"),
            ("claude-haiku-9", "global.anthropic.claude-haiku-9"),
        ]);
        assert_eq!(
            m.id("claude-opus-4-8", "claude-opus-4-8").as_deref(),
            Some("us.anthropic.claude-opus-4-8-v1:0")
        );
        assert_eq!(
            m.id("claude-*", "claude-sonnet-5").as_deref(),
            Some("eu.anthropic.claude-sonnet-5-v1:0"),
            "the template of the pattern entry"
        );
        assert_eq!(
            m.id("claude-*", "claude-haiku-9").as_deref(),
            Some("global.anthropic.claude-haiku-9"),
            "a listed name wins over the template"
        );
        let listed = map(&[("claude-haiku-9", "h")]);
        assert_eq!(listed.id("claude-*", "claude-sonnet-5"), None);
        assert_eq!(listed.id("gpt-4o", "gpt-4o"), None);
    }
}
