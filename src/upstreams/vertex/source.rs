//! Which credentials a Vertex deployment would use, in words, for
//! `check-config` and the log: the file it names, or where Application
//! Default Credentials would find them, in their order (Google's AIP-4110
//! and the `google-cloud-auth` crate: `GOOGLE_APPLICATION_CREDENTIALS`,
//! gcloud's application-default file, the metadata server). A file's
//! `type` and account are shown, never its key.

use std::path::{Path, PathBuf};

use crate::config::vertex::VertexCredentials;
use crate::config::{Policy, UpstreamKind};

/// The metadata server's host unless `GCE_METADATA_HOST` moves it.
const METADATA_HOST: &str = "metadata.google.internal";

/// `credentials` in words.
pub fn describe(credentials: &VertexCredentials) -> String {
    match credentials {
        VertexCredentials::File(p) => format!("credentials file {}", file_words(p)),
        VertexCredentials::Adc => format!("Application Default Credentials: {}", adc_words()),
    }
}

/// One line per Vertex deployment of `policy`: its name and [`describe`].
pub fn describe_policy(policy: &Policy) -> Vec<String> {
    policy
        .upstreams
        .iter()
        .filter(|u| u.kind == UpstreamKind::Vertex)
        .filter_map(|u| {
            let v = u.vertex.as_deref()?;
            Some(format!(
                "upstream {:?} (vertex, project {}, region {}): {}",
                u.name,
                v.project,
                v.region,
                describe(&v.credentials)
            ))
        })
        .collect()
}

fn adc_words() -> String {
    if let Some(p) = std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS") {
        return format!(
            "GOOGLE_APPLICATION_CREDENTIALS={}",
            file_words(Path::new(&p))
        );
    }
    if let Some(p) = well_known_file().filter(|p| p.exists()) {
        return format!("gcloud's application-default file {}", file_words(&p));
    }
    let host = std::env::var("GCE_METADATA_HOST").unwrap_or_else(|_| METADATA_HOST.into());
    format!("the metadata server at {host}")
}

/// gcloud's application-default credentials file (AIP-4113, Linux and macOS).
fn well_known_file() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".config/gcloud/application_default_credentials.json"))
}

/// `path` with its `type` and account (`client_email`), or why it cannot
/// be read.
fn file_words(path: &Path) -> String {
    let shown = path.display();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return format!("{shown} (cannot be read: {e}; the deployment will be skipped)"),
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return format!("{shown} (not JSON; the deployment will be skipped)");
    };
    let field = |k: &str| json.get(k).and_then(|v| v.as_str()).unwrap_or("");
    match (field("type"), field("client_email")) {
        ("", _) => format!("{shown} (no type; the deployment will be skipped)"),
        (t, "") => format!("{shown} ({t})"),
        (t, who) => format!("{shown} ({t}, {who})"),
    }
}
