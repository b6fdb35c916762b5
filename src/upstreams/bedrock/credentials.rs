//! SigV4 credentials of Bedrock deployments: the AWS SDK's default
//! credential chain (`aws-config`: environment, shared profile, web
//! identity token file through STS, container endpoint, IMDSv2), one chain
//! per deployment (its region and profile), each behind a small cache.
//!
//! The cache is ours because the SDK's identity cache is reachable only
//! through a service client's orchestrator; the rule is the SDK's: reuse
//! credentials until [`REFRESH_BEFORE`] ahead of their expiry, then ask
//! the chain again (which rereads a rewritten web identity token file and
//! calls the container endpoint again), one refresh at a time. Credentials
//! are never logged: `Credentials`' `Debug` redacts the secret, and the
//! errors here carry the provider's message only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::Region;
use aws_credential_types::provider::ProvideCredentials;
use aws_credential_types::Credentials;

use crate::clock::{Clock as _, SystemClock};
use crate::config::bedrock::{BedrockAuth, BedrockSettings};
use crate::config::{Policy, UpstreamKind};

/// How long before their expiry credentials are refreshed.
pub const REFRESH_BEFORE: Duration = Duration::from_secs(300);

/// One deployment's chain and its current credentials.
struct Cached {
    chain: DefaultCredentialsChain,
    /// What the chain was built for: a reload that changes it builds a new one.
    built_for: BedrockSettings,
    current: tokio::sync::Mutex<Option<Credentials>>,
}

impl Cached {
    async fn get(&self) -> Result<Credentials, String> {
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_ref() {
            // Credentials expire on the wall clock, not the budget clock.
            let now = UNIX_EPOCH + Duration::from_micros(SystemClock.now_micros());
            let fresh = c.expiry().is_none_or(|e| e > now + REFRESH_BEFORE);
            if fresh {
                return Ok(c.clone());
            }
        }
        let c = self
            .chain
            .provide_credentials()
            .await
            .map_err(|e| describe(&e))?;
        *current = Some(c.clone());
        Ok(c)
    }
}

/// A credential error as one line: the error and its sources, which name
/// the provider that failed (never a secret: providers do not put them
/// in their errors).
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The credential chains of every Bedrock deployment, by deployment name.
#[derive(Default)]
pub struct AwsCredentials {
    chains: Mutex<HashMap<String, Arc<Cached>>>,
    /// Deployments skipped since start: their credentials could not be loaded.
    skipped: Mutex<Vec<String>>,
}

impl AwsCredentials {
    /// Credentials for `deployment` signing under `settings` (its chain
    /// built on first use).
    pub async fn get(
        &self,
        deployment: &str,
        settings: &BedrockSettings,
    ) -> Result<Credentials, String> {
        let cached = {
            let chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
            chains
                .get(deployment)
                .filter(|c| c.built_for == *settings)
                .cloned()
        };
        let cached = match cached {
            Some(c) => c,
            None => {
                let c = Arc::new(Cached {
                    chain: chain(settings).await,
                    built_for: settings.clone(),
                    current: tokio::sync::Mutex::new(None),
                });
                let mut chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
                chains.insert(deployment.to_string(), c.clone());
                c
            }
        };
        cached.get().await
    }

    /// Loads the credentials of every SigV4 Bedrock deployment of
    /// `policy`; returns those that could not be loaded, with why.
    pub async fn load_all(&self, policy: &Policy) -> Vec<(String, String)> {
        let mut failed = Vec::new();
        for u in &policy.upstreams {
            let Some(s) = u
                .bedrock
                .as_ref()
                .filter(|_| u.kind == UpstreamKind::Bedrock)
            else {
                continue;
            };
            if !matches!(s.auth, BedrockAuth::SigV4 { .. }) {
                continue;
            }
            if let Err(e) = self.get(&u.name, s).await {
                failed.push((u.name.clone(), e));
            }
        }
        let mut skipped = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
        skipped.extend(failed.iter().map(|(n, _)| n.clone()));
        failed
    }

    /// The deployments skipped at start (`/readyz` names them).
    pub fn skipped(&self) -> Vec<String> {
        self.skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

async fn chain(settings: &BedrockSettings) -> DefaultCredentialsChain {
    let mut b = DefaultCredentialsChain::builder().region(Region::new(settings.region.clone()));
    if let BedrockAuth::SigV4 {
        profile: Some(p), ..
    } = &settings.auth
    {
        b = b.profile_name(p);
    }
    b.build().await
}
