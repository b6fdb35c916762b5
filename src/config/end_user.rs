//! The secret that end-user ids are hashed with (docs/SCOPES.md).
//!
//! An end-user id is whatever the client sends (an e-mail address, a
//! database id): personal data, often guessable. It never reaches a stored
//! key, a log line or a metric as written: only its HMAC-SHA-256 under a
//! key read from the environment (`server.end_user_key_env`, default
//! `BUDGETGATE_END_USER_KEY`), cut to 128 bits and written in hex. Without
//! the key, a hash of a guessable id could be reversed by trying
//! candidates; every gateway of a fleet must have the same key, or each
//! would count an end user under a different name.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the HMAC kept (128 bits: no two of billions of end users
/// collide in practice, and the keys stay short).
const HASH_BYTES: usize = 16;

/// Shortest key accepted, bytes.
pub const MIN_KEY_BYTES: usize = 16;

/// The HMAC, keyed once. Its `Debug` never shows the key.
pub struct EndUserKey(Hmac<Sha256>);

impl std::fmt::Debug for EndUserKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EndUserKey(..)")
    }
}

impl EndUserKey {
    /// A key of `bytes` (at least [`MIN_KEY_BYTES`], checked at load).
    pub fn new(bytes: &[u8]) -> Self {
        Self(Hmac::new_from_slice(bytes).expect("HMAC takes keys of any length"))
    }

    /// The name an end-user id goes by everywhere: 32 lower-case hex digits
    /// of its keyed hash. Only `[0-9a-f]`, so it cannot break a key's
    /// hash tag, a separator or a log line whatever the id holds.
    pub fn hash(&self, id: &[u8]) -> String {
        let mut mac = self.0.clone();
        mac.update(id);
        let out = mac.finalize().into_bytes();
        hex::encode(&out[..HASH_BYTES])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_keyed_fixed_and_plain() {
        let a = EndUserKey::new(b"0123456789abcdef");
        let b = EndUserKey::new(b"fedcba9876543210");
        let h = a.hash(b"alice@example.com");
        assert_eq!(h.len(), 32);
        assert!(h
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(h, a.hash(b"alice@example.com"));
        assert_ne!(h, b.hash(b"alice@example.com"));
        assert_ne!(h, a.hash(b"bob@example.com"));
        // RFC 4231 test case 2 (key "Jefe"), cut to 128 bits.
        let jefe = EndUserKey::new(b"Jefe");
        assert_eq!(
            jefe.hash(b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c7"
        );
        for hostile in ["{x}", "a\nb", "}", "\u{0}"] {
            let h = a.hash(hostile.as_bytes());
            assert!(h.bytes().all(|c| c.is_ascii_hexdigit()), "{hostile:?}");
        }
        assert_eq!(format!("{a:?}"), "EndUserKey(..)");
    }
}
