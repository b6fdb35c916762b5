//! The access tokens of Vertex deployments, through `google-cloud-auth`
//! (Application Default Credentials, or the key file a deployment names).
//! The crate caches each source's token and refreshes it before it
//! expires, in a task of its own; nothing here logs a token or a key.
//!
//! Each deployment's source is loaded when the gateway starts (and again
//! when a reload changes its settings). A source that cannot be loaded
//! (a missing or unreadable key file, a file of the wrong kind) leaves its
//! deployment skipped: logged, named by `/readyz`, never routed to, while
//! the gateway serves the rest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use google_cloud_auth::credentials::{self, service_account, user_account, AccessTokenCredentials};
use reqwest::header::HeaderValue;

use crate::config::vertex::{VertexCredentials, VertexSettings};
use crate::config::{Policy, UpstreamKind, UpstreamPolicy};

/// The OAuth scope of Vertex AI's API (Google's "OAuth 2.0 Scopes for
/// Google APIs": `cloud-platform` covers `aiplatform`).
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// One deployment's token source, or none (its credentials failed to load).
#[derive(Clone)]
enum Source {
    Ready(AccessTokenCredentials),
    Skipped,
}

struct Entry {
    settings: Arc<crate::config::vertex::VertexSettings>,
    source: Source,
}

/// Token sources by deployment name (every serving thread shares them).
#[derive(Default)]
pub struct VertexTokens {
    entries: Mutex<HashMap<String, Entry>>,
}

impl VertexTokens {
    /// Loads the source of every Vertex deployment of `policy` whose
    /// settings are new or changed (in a tokio runtime: the crate's
    /// refresh tasks run there), logs those skipped, and forgets
    /// deployments the policy no longer has.
    pub fn load(&self, policy: &Policy) {
        let mut entries = self.lock();
        entries.retain(|name, _| {
            policy
                .upstreams
                .iter()
                .any(|u| u.kind == UpstreamKind::Vertex && &u.name == name)
        });
        for u in policy
            .upstreams
            .iter()
            .filter(|u| u.kind == UpstreamKind::Vertex)
        {
            let Some(settings) = &u.vertex else { continue };
            if entries
                .get(&u.name)
                .is_some_and(|e| e.settings == *settings)
            {
                continue;
            }
            entries.insert(u.name.clone(), entry(u, settings));
        }
    }

    /// The deployments skipped for want of credentials, by name.
    pub fn skipped(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, e)| matches!(e.source, Source::Skipped))
            .map(|(n, _)| n.clone())
            .collect();
        names.sort();
        names
    }

    /// Whether `upstream` (kind `vertex`) was skipped at load.
    pub fn is_skipped(&self, upstream: &UpstreamPolicy) -> bool {
        self.lock()
            .get(&upstream.name)
            .is_some_and(|e| matches!(e.source, Source::Skipped))
    }

    /// The `Authorization` value of a request to `upstream`: its source's
    /// current token (loaded now if no load saw this deployment). `None`
    /// when there is no source or no token (logged, without the token).
    pub async fn authorization(&self, upstream: &UpstreamPolicy) -> Option<HeaderValue> {
        let settings = upstream.vertex.as_ref()?;
        let source = {
            let mut entries = self.lock();
            match entries.get(&upstream.name) {
                Some(e) if e.settings == *settings => e.source.clone(),
                _ => {
                    let e = entry(upstream, settings);
                    let source = e.source.clone();
                    entries.insert(upstream.name.clone(), e);
                    source
                }
            }
        };
        let creds = match source {
            Source::Ready(c) => c,
            Source::Skipped => return None,
        };
        match creds.access_token().await {
            Ok(t) => {
                let mut v = HeaderValue::try_from(format!("Bearer {}", t.token)).ok()?;
                v.set_sensitive(true);
                Some(v)
            }
            Err(e) => {
                // The crate's errors name the source and what failed, never a
                // token or key (its Debug output censors them).
                tracing::warn!(deployment = %upstream.name, transient = e.is_transient(), error = %e, "no access token for a vertex deployment");
                None
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn entry(u: &UpstreamPolicy, settings: &Arc<VertexSettings>) -> Entry {
    let source = match build(&settings.credentials) {
        Ok(c) => {
            tracing::info!(deployment = %u.name, credentials = %super::source::describe(&settings.credentials), "vertex credentials loaded");
            Source::Ready(c)
        }
        Err(why) => {
            tracing::warn!(deployment = %u.name, credentials = %super::source::describe(&settings.credentials), reason = %why, "vertex deployment skipped: its credentials could not be loaded");
            Source::Skipped
        }
    };
    Entry {
        settings: settings.clone(),
        source,
    }
}

/// The token source of `credentials`. Errors say what failed and where,
/// never what a file holds.
fn build(credentials: &VertexCredentials) -> Result<AccessTokenCredentials, String> {
    match credentials {
        VertexCredentials::Adc => credentials::Builder::default()
            .with_scopes([SCOPE])
            .build_access_token_credentials()
            .map_err(|e| {
                if e.is_parsing() {
                    "Application Default Credentials: the credentials file is not valid".into()
                } else {
                    format!("Application Default Credentials: {e}")
                }
            }),
        VertexCredentials::File(path) => {
            let shown = path.display();
            let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|_| format!("{shown}: not JSON"))?;
            let kind = json.get("type").and_then(|t| t.as_str()).unwrap_or("");
            let built = match kind {
                "service_account" => service_account::Builder::new(json.clone())
                    .with_access_specifier(service_account::AccessSpecifier::from_scopes([
                        SCOPE,
                    ]))
                    .build_access_token_credentials(),
                "authorized_user" => user_account::Builder::new(json.clone())
                    .with_scopes([SCOPE])
                    .build_access_token_credentials(),
                other => {
                    return Err(format!(
                        "{shown}: credentials of type {other:?}: a service_account key or an authorized_user file (or use Application Default Credentials)"
                    ))
                }
            };
            built.map_err(|e| {
                if e.is_missing_field() || e.is_parsing() {
                    format!("{shown}: not a valid {kind} file")
                } else {
                    format!("{shown}: {e}")
                }
            })
        }
    }
}
