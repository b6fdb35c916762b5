//! `kind = "vertex"`: Claude on Google Vertex AI (docs/VERTEX.md). The
//! `[upstreams.vertex]` table as written and validated: the project and
//! region in the endpoint's path, and where the access tokens come from.
//! Obtaining the tokens is [`crate::upstreams::vertex`]'s.

use std::path::PathBuf;

/// The `anthropic_version` a Vertex body carries (in the body, not a
/// header: Vertex AI, "Use Anthropic's Claude models").
pub const ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// `[upstreams.vertex]` as written.
#[derive(Debug, serde::Deserialize, serde::Serialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawVertex {
    /// The Google Cloud project id.
    pub project: Option<String>,
    /// The location: a region (`us-east5`, `europe-west1`) or `global`.
    pub region: Option<String>,
    /// A credentials JSON file (a service-account key, or any file
    /// Application Default Credentials reads); unset: Application Default
    /// Credentials.
    pub credentials_file: Option<String>,
    /// Whose models the deployment serves: `"anthropic"` (Claude, the
    /// default) or `"google"` (Gemini).
    pub publisher: Option<String>,
}

/// The publisher in a Vertex model's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Publisher {
    /// `publishers/anthropic`: Claude, Anthropic's Messages body.
    #[default]
    Anthropic,
    /// `publishers/google`: Gemini, `generateContent`.
    Google,
}

impl Publisher {
    /// The word in the path.
    pub fn word(self) -> &'static str {
        match self {
            Publisher::Anthropic => "anthropic",
            Publisher::Google => "google",
        }
    }
}

/// Where a Vertex deployment's access tokens come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VertexCredentials {
    /// The credentials file the config names.
    File(PathBuf),
    /// Application Default Credentials: `GOOGLE_APPLICATION_CREDENTIALS`,
    /// then gcloud's application-default file, then the metadata server
    /// (`GCE_METADATA_HOST` moves it).
    Adc,
}

/// `[upstreams.vertex]` as validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VertexSettings {
    /// The project id in the endpoint's path.
    pub project: String,
    /// The location in the endpoint's path (and the default host).
    pub region: String,
    /// Where access tokens come from.
    pub credentials: VertexCredentials,
    /// Whose models it serves.
    pub publisher: Publisher,
}

/// The endpoint of `region` when `base_url` is not set: the regional host,
/// or the global one for `global`.
pub fn default_base_url(region: &str) -> String {
    if region == "global" {
        "https://aiplatform.googleapis.com".into()
    } else {
        format!("https://{region}-aiplatform.googleapis.com")
    }
}

/// A project id or location: lower-case letters, digits and `-` (they go
/// into the URL path and, for a region, the host name).
fn is_path_word(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl VertexSettings {
    /// Validates `[upstreams.vertex]` of the deployment at `path`, reporting
    /// each mistake through `err(path, message)`.
    pub fn validate(
        path: &str,
        raw: Option<&RawVertex>,
        mut err: impl FnMut(&str, String),
    ) -> Option<VertexSettings> {
        let Some(raw) = raw else {
            err(
                &format!("{path}.vertex"),
                "required for kind = \"vertex\": project and region".into(),
            );
            return None;
        };
        let mut word = |field: &str, v: &Option<String>| match v.as_deref() {
            Some(w) if is_path_word(w) => Some(w.to_string()),
            Some(w) => {
                err(
                    &format!("{path}.vertex.{field}"),
                    format!("{w:?}: lower-case letters, digits and '-' only"),
                );
                None
            }
            None => {
                err(&format!("{path}.vertex.{field}"), "required".into());
                None
            }
        };
        let project = word("project", &raw.project);
        let region = word("region", &raw.region);
        let credentials = match raw.credentials_file.as_deref() {
            None => VertexCredentials::Adc,
            Some(f) if !f.trim().is_empty() => VertexCredentials::File(PathBuf::from(f)),
            Some(_) => {
                err(
                    &format!("{path}.vertex.credentials_file"),
                    "must not be empty (leave it out for Application Default Credentials)".into(),
                );
                return None;
            }
        };
        let publisher = match raw.publisher.as_deref() {
            None | Some("anthropic") => Publisher::Anthropic,
            Some("google") => Publisher::Google,
            Some(other) => {
                err(
                    &format!("{path}.vertex.publisher"),
                    format!("must be \"anthropic\" or \"google\", not {other:?}"),
                );
                return None;
            }
        };
        Some(VertexSettings {
            project: project?,
            region: region?,
            credentials,
            publisher,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_each_mistake() {
        let mut errors = Vec::new();
        let raw = RawVertex {
            project: Some("Acme Prod".into()),
            region: None,
            credentials_file: None,
            publisher: None,
        };
        let got = VertexSettings::validate("upstreams[0]", Some(&raw), |p, m| {
            errors.push(format!("{p}: {m}"))
        });
        assert_eq!(got, None);
        assert_eq!(
            errors,
            vec![
                "upstreams[0].vertex.project: \"Acme Prod\": lower-case letters, digits and '-' only",
                "upstreams[0].vertex.region: required",
            ]
        );
        let raw = RawVertex {
            project: Some("acme-prod".into()),
            region: Some("us-east5".into()),
            credentials_file: Some("/etc/sa.json".into()),
            publisher: None,
        };
        let got = VertexSettings::validate("u", Some(&raw), |_, _| panic!());
        assert_eq!(
            got,
            Some(VertexSettings {
                project: "acme-prod".into(),
                region: "us-east5".into(),
                publisher: Publisher::Anthropic,
                credentials: VertexCredentials::File("/etc/sa.json".into()),
            })
        );
    }

    #[test]
    fn default_hosts_are_regional_or_global() {
        assert_eq!(
            default_base_url("us-east5"),
            "https://us-east5-aiplatform.googleapis.com"
        );
        assert_eq!(
            default_base_url("global"),
            "https://aiplatform.googleapis.com"
        );
    }
}
