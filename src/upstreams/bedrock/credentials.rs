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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::Region;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;

use crate::clock::{Clock as _, SystemClock};
use crate::config::bedrock::{BedrockAuth, BedrockSettings};
use crate::config::{Policy, UpstreamKind, UpstreamPolicy};

/// How long before their expiry credentials are refreshed.
pub const REFRESH_BEFORE: Duration = Duration::from_secs(300);

/// How long after a failed refresh the cached credentials are served
/// before the chain is asked again (while they have not expired).
pub const REFRESH_RETRY: Duration = Duration::from_secs(10);

/// One deployment's chain and its current credentials.
struct Cached {
    chain: SharedCredentialsProvider,
    /// What the chain was built for: a reload that changes it builds a new one.
    built_for: BedrockSettings,
    current: tokio::sync::Mutex<Current>,
}

#[derive(Default)]
struct Current {
    credentials: Option<Credentials>,
    /// After a failed refresh: not asked again before then.
    retry_at: Option<SystemTime>,
}

impl Cached {
    fn new(chain: SharedCredentialsProvider, built_for: BedrockSettings) -> Self {
        Self {
            chain,
            built_for,
            current: tokio::sync::Mutex::new(Current::default()),
        }
    }

    /// The credentials to sign with: the cached ones while fresh, else
    /// the chain's. A refresh that fails while the cached ones are still
    /// valid serves them (a refresh starts five minutes early) and is
    /// tried again after [`REFRESH_RETRY`].
    async fn get(&self, deployment: &str) -> Result<Credentials, String> {
        let mut current = self.current.lock().await;
        // Credentials expire on the wall clock, not the budget clock.
        let now = UNIX_EPOCH + Duration::from_micros(SystemClock.now_micros());
        let valid = |c: &Credentials, at: SystemTime| c.expiry().is_none_or(|e| e > at);
        if let Some(c) = current.credentials.as_ref() {
            let waiting = current.retry_at.is_some_and(|t| now < t);
            if valid(c, now + REFRESH_BEFORE) || (waiting && valid(c, now)) {
                return Ok(c.clone());
            }
        }
        match self.chain.provide_credentials().await {
            Ok(c) => {
                current.credentials = Some(c.clone());
                current.retry_at = None;
                Ok(c)
            }
            Err(e) => {
                let why = describe(&e);
                match current.credentials.clone().filter(|c| valid(c, now)) {
                    Some(c) => {
                        tracing::warn!(%deployment, error = %why, retry_secs = REFRESH_RETRY.as_secs(), "AWS credentials could not be refreshed; the cached ones are used until they expire");
                        current.retry_at = Some(now + REFRESH_RETRY);
                        Ok(c)
                    }
                    None => Err(why),
                }
            }
        }
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
    /// Deployments skipped by the last load (start or reload): their
    /// credentials could not be loaded, under these settings.
    skipped: Mutex<HashMap<String, BedrockSettings>>,
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
                let chain = SharedCredentialsProvider::new(chain(settings).await);
                let c = Arc::new(Cached::new(chain, settings.clone()));
                let mut chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
                chains.insert(deployment.to_string(), c.clone());
                c
            }
        };
        cached.get(deployment).await
    }

    /// Loads the credentials of every SigV4 Bedrock deployment of
    /// `policy`, at start and after each reload (on the runtime that
    /// outlives the serving threads); returns those that could not be
    /// loaded, with why. Those are skipped (never routed to, named by
    /// `/readyz`) until a later load succeeds; deployments the policy no
    /// longer has are forgotten.
    pub async fn load_all(&self, policy: &Policy) -> Vec<(String, String)> {
        let sigv4: Vec<(&str, &BedrockSettings)> = policy
            .upstreams
            .iter()
            .filter(|u| u.kind == UpstreamKind::Bedrock)
            .filter_map(|u| u.bedrock.as_ref().map(|s| (u.name.as_str(), s)))
            .filter(|(_, s)| matches!(s.auth, BedrockAuth::SigV4 { .. }))
            .collect();
        {
            let keep = |name: &String| sigv4.iter().any(|(n, _)| n == name);
            let mut chains = self.chains.lock().unwrap_or_else(|e| e.into_inner());
            chains.retain(|n, _| keep(n));
        }
        let mut failed = Vec::new();
        let mut skipped = HashMap::new();
        for (name, s) in sigv4 {
            if let Err(e) = self.get(name, s).await {
                skipped.insert(name.to_string(), s.clone());
                failed.push((name.to_string(), e));
            }
        }
        *self.skipped.lock().unwrap_or_else(|e| e.into_inner()) = skipped;
        failed
    }

    /// The deployments skipped by the last load (`/readyz` names them).
    pub fn skipped(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Whether `upstream` (kind `bedrock`) was skipped by the last load
    /// under its current settings.
    pub fn is_skipped(&self, upstream: &UpstreamPolicy) -> bool {
        let skipped = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
        if skipped.is_empty() {
            return false;
        }
        skipped
            .get(&upstream.name)
            .is_some_and(|s| upstream.bedrock.as_ref() == Some(s))
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

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::provider::{error::CredentialsError, future};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Credentials expiring in two minutes (inside the refresh margin),
    /// then errors; counts its calls.
    #[derive(Debug, Default)]
    struct Flaky(AtomicU32);

    impl ProvideCredentials for Flaky {
        fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            let call = self.0.fetch_add(1, Ordering::SeqCst);
            let now = UNIX_EPOCH + Duration::from_micros(SystemClock.now_micros());
            future::ProvideCredentials::ready(if call == 0 {
                Ok(Credentials::new(
                    "AKIDEXAMPLE",
                    "secret",
                    None,
                    Some(now + Duration::from_secs(120)),
                    "test",
                ))
            } else {
                Err(CredentialsError::provider_error("the endpoint is down"))
            })
        }
    }

    /// Fault guarded against (by reading): a refresh that failed five
    /// minutes before expiry failed the request although the cached
    /// credentials were valid.
    #[tokio::test]
    async fn a_failed_early_refresh_serves_the_cached_credentials_and_retries_later() {
        let flaky = Arc::new(Flaky::default());
        let provider: Arc<dyn ProvideCredentials> = flaky.clone();
        let settings = crate::config::Policy::from_toml(
            "[[upstreams]]\nname = \"br\"\nkind = \"bedrock\"\nbase_url = \"https://b.example\"\nbedrock = { region = \"us-east-1\" }\n",
        )
        .unwrap()
        .upstreams[0]
            .bedrock
            .clone()
            .unwrap();
        let cached = Cached::new(SharedCredentialsProvider::from(provider), settings);
        let first = cached.get("br").await.unwrap();
        let again = cached
            .get("br")
            .await
            .expect("served the cached credentials");
        assert_eq!(again.access_key_id(), first.access_key_id());
        assert_eq!(flaky.0.load(Ordering::SeqCst), 2, "a refresh was tried");
        cached.get("br").await.unwrap();
        assert_eq!(
            flaky.0.load(Ordering::SeqCst),
            2,
            "not asked again before REFRESH_RETRY"
        );
    }
}
