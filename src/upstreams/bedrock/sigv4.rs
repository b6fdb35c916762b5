//! AWS Signature Version 4 of one Bedrock request, by `aws-sigv4` (the
//! SDK's own signer): the headers to add (`authorization`, `x-amz-date`,
//! `x-amz-security-token` for temporary credentials). The signature covers
//! `host`, every header passed in and the body's SHA-256.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;

/// Why a request could not be signed (a URL the signer cannot parse; the
/// message never holds a credential).
#[derive(Debug, thiserror::Error)]
#[error("SigV4 signing failed: {0}")]
pub struct SigningFailed(String);

/// The headers that sign `method url` with `headers` and `body` for
/// `service` in `region` at `time`. `url` is sent as given (its path
/// already percent-encoded); the signer encodes it once more for the
/// canonical request, as SigV4 asks of every service but S3.
// The request's parts and the signing context, as the signer takes them.
#[allow(clippy::too_many_arguments)]
pub fn sign_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    credentials: &Credentials,
    region: &str,
    service: &str,
    time: SystemTime,
) -> Result<Vec<(&'static str, String)>, SigningFailed> {
    let identity: Identity = credentials.clone().into();
    let params: aws_sigv4::http_request::SigningParams<'_> = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| SigningFailed(e.to_string()))?
        .into();
    let signable = SignableRequest::new(
        method,
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| SigningFailed(e.to_string()))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| SigningFailed(e.to_string()))?
        .into_parts();
    let (headers, _) = instructions.into_parts();
    Ok(headers
        .into_iter()
        .map(|h| (h.name(), h.value().to_string()))
        .collect())
}
