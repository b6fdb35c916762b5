//! Typed indices into one policy's lists: what authentication and routing
//! return, so that a request names its tenant, key, model and deployment
//! by position in the policy it holds, never by address; and which
//! tenant, key and key-prefix names are valid.

use super::{KeyPolicy, ModelPolicy, Policy, TenantPolicy, UpstreamPolicy};

/// True for a valid tenant or key id: `[A-Za-z0-9._-]{1,64}`.
pub fn is_valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// True for a valid key prefix: non-empty, printable ASCII, no `{`, `}` or whitespace.
pub fn is_valid_prefix(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
}

/// A tenant: index into [`Policy::tenants`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TenantId(pub(super) usize);

/// A key of a tenant: index into [`TenantPolicy::keys`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub(super) usize);

/// A public model: index into [`Policy::models`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelId(pub(super) usize);

/// An upstream deployment: index into [`Policy::upstreams`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeploymentId(pub(super) usize);

impl Policy {
    /// The tenant and key a presented API key belongs to (by SHA-256),
    /// unless that secret is expired at `now` (UTC µs): a key's expiry and
    /// a rotated secret's end are checked on every request, so they need
    /// no propagation.
    pub fn find_key(&self, presented_key: &str, now: u64) -> Option<(TenantId, KeyId)> {
        use sha2::Digest;
        let digest: [u8; 32] = sha2::Sha256::digest(presented_key.as_bytes()).into();
        self.key_index
            .get(&digest)
            .filter(|r| now < r.not_after)
            .map(|r| (TenantId(r.tenant), KeyId(r.key)))
    }

    /// Authenticates a presented API key at `now`: `(tenant, key)` when its
    /// SHA-256 matches a secret that has not expired.
    pub fn authenticate(
        &self,
        presented_key: &str,
        now: u64,
    ) -> Option<(&TenantPolicy, &KeyPolicy)> {
        let (t, k) = self.find_key(presented_key, now)?;
        Some((self.tenant(t), self.key(t, k)))
    }

    /// The model serving the name a client sent ([`Policy::model`]).
    pub fn model_id(&self, name: &str) -> Option<ModelId> {
        self.model_index.resolve(name).map(ModelId)
    }

    /// The tenant `id`.
    pub fn tenant(&self, id: TenantId) -> &TenantPolicy {
        &self.tenants[id.0]
    }

    /// Key `key` of tenant `tenant`.
    pub fn key(&self, tenant: TenantId, key: KeyId) -> &KeyPolicy {
        &self.tenants[tenant.0].keys[key.0]
    }

    /// The model `id`.
    pub fn model_at(&self, id: ModelId) -> &ModelPolicy {
        &self.models[id.0]
    }

    /// The deployment `id`.
    pub fn deployment(&self, id: DeploymentId) -> &UpstreamPolicy {
        &self.upstreams[id.0]
    }

    /// The deployments of model `id`, in configured order.
    pub fn deployments_of(&self, id: ModelId) -> impl Iterator<Item = DeploymentId> + '_ {
        self.models[id.0].upstreams.iter().map(|&u| DeploymentId(u))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_and_prefix_validation() {
        assert!(is_valid_id("acme-prod_1.x"));
        assert!(!is_valid_id(""));
        assert!(!is_valid_id("a/b"));
        assert!(!is_valid_id(&"a".repeat(65)));
        assert!(is_valid_prefix("budgetgate"));
        assert!(!is_valid_prefix("bg{x}"));
        assert!(!is_valid_prefix("b g"));
    }
}
