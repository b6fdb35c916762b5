//! `kind = "bedrock"` (docs/BEDROCK.md): Claude on Amazon Bedrock. The
//! `[upstreams.bedrock]` table says which API a deployment calls, in which
//! region it signs, and where its SigV4 credentials come from:
//!
//! - `api = "messages"`: Bedrock's Anthropic Messages endpoint,
//!   `POST {base_url}/anthropic/v1/messages` (the base URL is
//!   `https://bedrock-mantle.{region}.api.aws` or
//!   `https://bedrock-runtime.{region}.amazonaws.com`), the Anthropic body
//!   with `model` set to the Bedrock model id, SSE back.
//! - `api = "invoke"` (the default): `InvokeModel` /
//!   `InvokeModelWithResponseStream`,
//!   `POST {base_url}/model/{model id}/invoke[-with-response-stream]`, the
//!   body without `model` and with `anthropic_version`, event-stream back.
//!
//! Authentication: the deployment's `api_key_env` (an Amazon Bedrock API
//! key) when set, else SigV4 with credentials from the AWS SDK's default
//! chain (environment, shared profile, web identity token file, container,
//! instance metadata) under `profile` if named.

use serde::{Deserialize, Serialize};

/// `[upstreams.bedrock]` as written.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawBedrock {
    /// AWS region the requests are signed for (`us-east-1`).
    pub region: Option<String>,
    /// `"invoke"` (default) or `"messages"`.
    pub api: Option<String>,
    /// SigV4 service name (default `bedrock`).
    pub signing_name: Option<String>,
    /// Shared-config profile the credential chain reads (default: the
    /// SDK's own choice, `AWS_PROFILE` or `default`).
    pub profile: Option<String>,
}

/// Which Bedrock API a deployment calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BedrockApi {
    /// `InvokeModel` / `InvokeModelWithResponseStream` (event-stream).
    Invoke,
    /// The Anthropic Messages endpoint (`/anthropic/v1/messages`, SSE).
    Messages,
}

/// How a deployment authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BedrockAuth {
    /// The deployment's API key (`api_key_env`): `x-api-key` on the
    /// Messages API, `Authorization: Bearer` on InvokeModel.
    ApiKey,
    /// SigV4 with the SDK's default credential chain, under `profile`.
    SigV4 {
        /// Shared-config profile, when named.
        profile: Option<String>,
    },
}

/// A Bedrock deployment's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BedrockSettings {
    /// Region signed for.
    pub region: String,
    /// API called.
    pub api: BedrockApi,
    /// SigV4 service name.
    pub signing_name: String,
    /// Authentication.
    pub auth: BedrockAuth,
}

/// The `anthropic_version` body field of InvokeModel (AWS, "Anthropic
/// Claude Messages API" parameters for Bedrock).
pub const INVOKE_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";

/// The SigV4 service name of Bedrock's runtime APIs.
pub const SIGNING_NAME: &str = "bedrock";

impl BedrockSettings {
    /// Validates `[upstreams.bedrock]` (at `path`, e.g.
    /// `upstreams[2].bedrock`) of a deployment that has an API key
    /// (`has_api_key`) or not, reporting each problem through `err`.
    pub fn from_raw(
        path: &str,
        raw: Option<&RawBedrock>,
        has_api_key: bool,
        err: &mut dyn FnMut(String, String),
    ) -> Option<BedrockSettings> {
        let Some(raw) = raw else {
            err(
                format!("{path}.region"),
                "required for kind = \"bedrock\" ([upstreams.bedrock] region = \"us-east-1\")"
                    .into(),
            );
            return None;
        };
        let mut ok = true;
        let region = match raw.region.as_deref() {
            Some(r) if is_region(r) => r.to_string(),
            Some(r) => {
                err(
                    format!("{path}.region"),
                    format!("not an AWS region name: {r:?}"),
                );
                ok = false;
                String::new()
            }
            None => {
                err(
                    format!("{path}.region"),
                    "required: the region requests are signed for".into(),
                );
                ok = false;
                String::new()
            }
        };
        let api = match raw.api.as_deref().unwrap_or("invoke") {
            "invoke" => BedrockApi::Invoke,
            "messages" => BedrockApi::Messages,
            other => {
                err(
                    format!("{path}.api"),
                    format!("must be \"invoke\" or \"messages\", not {other:?}"),
                );
                ok = false;
                BedrockApi::Invoke
            }
        };
        let auth = if has_api_key {
            if raw.profile.is_some() {
                err(
                    format!("{path}.profile"),
                    "not used with api_key_env (an API key is not SigV4)".into(),
                );
                ok = false;
            }
            BedrockAuth::ApiKey
        } else {
            BedrockAuth::SigV4 {
                profile: raw.profile.clone(),
            }
        };
        ok.then(|| BedrockSettings {
            region,
            api,
            signing_name: raw
                .signing_name
                .clone()
                .unwrap_or_else(|| SIGNING_NAME.into()),
            auth,
        })
    }

    /// Where `check-config` says this deployment's credentials come from.
    pub fn credential_source(&self, api_key_env: Option<&str>) -> String {
        match &self.auth {
            BedrockAuth::ApiKey => format!(
                "an Amazon Bedrock API key from ${}",
                api_key_env.unwrap_or("?")
            ),
            BedrockAuth::SigV4 { profile } => {
                let chain = crate::config::bedrock::sigv4_source(profile.as_deref(), |k| {
                    std::env::var(k).ok().filter(|v| !v.is_empty())
                });
                format!(
                    "SigV4 (service {:?}, region {}) with {chain}",
                    self.signing_name, self.region
                )
            }
        }
    }
}

/// The first source of the AWS SDK's default credential chain that the
/// environment `env` sets up (the order of `aws-config`'s
/// `DefaultCredentialsChain`): what the gateway would use.
pub fn sigv4_source(profile: Option<&str>, env: impl Fn(&str) -> Option<String>) -> String {
    if profile.is_none() && env("AWS_ACCESS_KEY_ID").is_some() {
        return "credentials from the environment (AWS_ACCESS_KEY_ID)".into();
    }
    if let Some(p) = profile.map(str::to_string).or_else(|| env("AWS_PROFILE")) {
        return format!("the shared config profile {p:?} (~/.aws/config, ~/.aws/credentials)");
    }
    let home = env("HOME").unwrap_or_default();
    let files = [
        env("AWS_SHARED_CREDENTIALS_FILE").unwrap_or(format!("{home}/.aws/credentials")),
        env("AWS_CONFIG_FILE").unwrap_or(format!("{home}/.aws/config")),
    ];
    if files.iter().any(|f| std::path::Path::new(f).exists()) {
        return "the shared config profile \"default\" (~/.aws/config, ~/.aws/credentials)".into();
    }
    if let Some(f) = env("AWS_WEB_IDENTITY_TOKEN_FILE") {
        return format!("a web identity token file ({f}) exchanged with STS (AWS_ROLE_ARN)");
    }
    if env("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
        || env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
    {
        return "the container credentials endpoint (AWS_CONTAINER_CREDENTIALS_*_URI)".into();
    }
    "the EC2 instance metadata service (IMDSv2), the chain's last source".into()
}

/// `us-east-1`, `eu-central-2`, `us-gov-west-1`: lower-case letters,
/// digits and dashes (it goes into the SigV4 credential scope).
fn is_region(r: &str) -> bool {
    !r.is_empty()
        && r.len() <= 32
        && r.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(region: &str) -> RawBedrock {
        RawBedrock {
            region: Some(region.into()),
            ..RawBedrock::default()
        }
    }

    #[test]
    fn defaults_to_invoke_signed_as_bedrock_and_refuses_a_bad_region() {
        let mut errors = Vec::new();
        let mut err = |p: String, m: String| errors.push((p, m));
        let s = BedrockSettings::from_raw("b", Some(&raw("eu-west-3")), false, &mut err).unwrap();
        assert_eq!(s.api, BedrockApi::Invoke);
        assert_eq!(s.signing_name, "bedrock");
        assert_eq!(s.auth, BedrockAuth::SigV4 { profile: None });
        assert!(BedrockSettings::from_raw("b", Some(&raw("US East")), false, &mut err).is_none());
        assert!(BedrockSettings::from_raw("b", None, false, &mut err).is_none());
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[0].0, "b.region");
    }

    #[test]
    fn the_source_named_follows_the_sdk_chain_order() {
        let env = |set: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                set.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(sigv4_source(
            None,
            env(&[("AWS_ACCESS_KEY_ID", "x"), ("HOME", "/nonexistent")])
        )
        .contains("environment"));
        assert!(
            sigv4_source(Some("prod"), env(&[("AWS_ACCESS_KEY_ID", "x")])).contains("\"prod\"")
        );
        assert!(sigv4_source(
            None,
            env(&[
                ("HOME", "/nonexistent"),
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t")
            ])
        )
        .contains("web identity"));
        assert!(sigv4_source(
            None,
            env(&[
                ("HOME", "/nonexistent"),
                ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://x")
            ])
        )
        .contains("container"));
        assert!(sigv4_source(None, env(&[("HOME", "/nonexistent")])).contains("IMDS"));
    }
}
