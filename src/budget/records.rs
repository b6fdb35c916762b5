//! Owner records of provider-side objects (stored Responses): which
//! tenant created a response, under which public model, on which
//! deployment, and its context size (input + output tokens) at
//! settlement. The gateway reads a record in a call of its own before the
//! reserve, so that a tenant can continue, read or delete only its own
//! stored responses, only on the deployment that holds them.
//!
//! Records are compact (a JSON array of four values) with a TTL (default
//! 30 days, the provider's retention). In Redis each record has a key of
//! its own (`<prefix>:{<id>}:v3:resp`): its hash tag is the response id, not
//! the budget domain's, so records spread over a Redis Cluster instead of
//! crowding the budget slot. In memory their number is capped (least
//! recently used first out, `budgetgate_response_records_evicted_total`);
//! an evicted id is unknown.
//!
//! Bytes per record and the size at a given request rate are measured in
//! docs/API.md ("Stored responses belong to one tenant").

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::redis::records::RedisRecords;
use super::StoreError;

/// Who owns a stored response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseRecord {
    /// Tenant name.
    pub tenant: String,
    /// Public model name.
    pub model: String,
    /// Deployment name that holds the response.
    pub deployment: String,
    /// Input + output tokens of the response (0 until it settled).
    pub context_tokens: u64,
}

impl ResponseRecord {
    /// The stored text: `[context, tenant, model, deployment]`.
    pub fn encode(&self) -> String {
        serde_json::json!([
            self.context_tokens,
            self.tenant,
            self.model,
            self.deployment
        ])
        .to_string()
    }

    /// Reads a stored text; `None` for anything else.
    pub fn decode(s: &str) -> Option<Self> {
        let (context_tokens, tenant, model, deployment): (u64, String, String, String) =
            serde_json::from_str(s).ok()?;
        Some(Self {
            tenant,
            model,
            deployment,
            context_tokens,
        })
    }
}

/// The record store of the configured budget store kind.
pub enum Records {
    /// In process, capped, LRU.
    Memory(MemoryRecords),
    /// In Redis, one key per record.
    Redis(RedisRecords),
}

impl Records {
    /// The record of `id`, if any (and not expired).
    pub async fn get(&self, id: &str) -> Result<Option<ResponseRecord>, StoreError> {
        match self {
            Records::Memory(m) => Ok(m.get(id)),
            Records::Redis(r) => r.get(id).await,
        }
    }

    /// Writes (or replaces) the record of `id`.
    pub async fn put(&self, id: &str, record: &ResponseRecord) -> Result<(), StoreError> {
        match self {
            Records::Memory(m) => {
                m.put(id, record.clone());
                Ok(())
            }
            Records::Redis(r) => r.put(id, record).await,
        }
    }

    /// Deletes the record of `id`.
    pub async fn delete(&self, id: &str) -> Result<(), StoreError> {
        match self {
            Records::Memory(m) => {
                m.delete(id);
                Ok(())
            }
            Records::Redis(r) => r.delete(id).await,
        }
    }
}

/// Records in memory: at most `max` (least recently used evicted), each
/// for `ttl`.
pub struct MemoryRecords {
    inner: Mutex<Lru>,
    max: usize,
    ttl: Duration,
}

#[derive(Default)]
struct Lru {
    map: HashMap<String, (ResponseRecord, Instant, u64)>,
    order: BTreeMap<u64, String>,
    tick: u64,
}

impl Lru {
    fn touch(&mut self, id: &str) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.map.get_mut(id) {
            self.order.remove(&e.2);
            e.2 = tick;
            self.order.insert(tick, id.to_string());
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some((_, _, tick)) = self.map.remove(id) {
            self.order.remove(&tick);
        }
    }
}

impl MemoryRecords {
    /// At most `max` records, each kept `ttl`.
    pub fn new(max: usize, ttl: Duration) -> Self {
        Self {
            inner: Mutex::new(Lru::default()),
            max: max.max(1),
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The record of `id`, refreshed as recently used.
    pub fn get(&self, id: &str) -> Option<ResponseRecord> {
        let mut l = self.lock();
        let (rec, expires) = l.map.get(id).map(|(r, e, _)| (r.clone(), *e))?;
        if expires <= Instant::now() {
            l.remove(id);
            metrics::gauge!("budgetgate_response_records").set(l.map.len() as f64);
            return None;
        }
        l.touch(id);
        Some(rec)
    }

    /// Writes `id`'s record, evicting the least recently used beyond the cap.
    pub fn put(&self, id: &str, record: ResponseRecord) {
        let mut l = self.lock();
        l.remove(id);
        l.tick += 1;
        let tick = l.tick;
        l.map
            .insert(id.to_string(), (record, Instant::now() + self.ttl, tick));
        l.order.insert(tick, id.to_string());
        while l.map.len() > self.max {
            let Some((_, oldest)) = l.order.pop_first() else {
                break;
            };
            l.map.remove(&oldest);
            metrics::counter!("budgetgate_response_records_evicted_total").increment(1);
        }
        metrics::gauge!("budgetgate_response_records").set(l.map.len() as f64);
    }

    /// Deletes `id`'s record.
    pub fn delete(&self, id: &str) {
        let mut l = self.lock();
        l.remove(id);
        metrics::gauge!("budgetgate_response_records").set(l.map.len() as f64);
    }

    /// Number of records held.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// True when no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: &str) -> ResponseRecord {
        ResponseRecord {
            tenant: t.into(),
            model: "m".into(),
            deployment: "d".into(),
            context_tokens: 7,
        }
    }

    #[test]
    fn encodes_compactly_and_back() {
        let r = rec("t1");
        assert_eq!(r.encode(), r#"[7,"t1","m","d"]"#);
        assert_eq!(ResponseRecord::decode(&r.encode()), Some(r));
        assert_eq!(ResponseRecord::decode("nonsense"), None);
    }

    #[test]
    fn lru_evicts_the_least_recently_used_and_the_evicted_is_unknown() {
        let m = MemoryRecords::new(2, crate::config::store::DEFAULT_RECORD_TTL);
        m.put("a", rec("a"));
        m.put("b", rec("b"));
        assert!(m.get("a").is_some()); // a is now the most recent
        m.put("c", rec("c"));
        assert_eq!(m.len(), 2);
        assert!(m.get("b").is_none(), "b was least recently used");
        assert!(m.get("a").is_some() && m.get("c").is_some());
        m.delete("a");
        assert!(m.get("a").is_none());
    }

    #[test]
    fn records_expire() {
        let m = MemoryRecords::new(10, Duration::from_millis(1));
        m.put("a", rec("a"));
        std::thread::sleep(Duration::from_millis(5));
        assert!(m.get("a").is_none());
        assert!(m.is_empty());
    }
}
