//! Owner records in Redis ([`crate::budget::records`]): one key per
//! record, `<prefix>:{<id>}:v<layout>:resp` ([`keys::response_record`]),
//! whose hash tag is the response id (not the budget domain's), written
//! with `SET … PX <ttl>`. The connection is
//! opened on first use, apart from the budget store's.

use std::time::Duration;

use redis::AsyncCommands;
use tokio::sync::OnceCell;

use super::conn::{map_err, Conn};
use crate::budget::keys;
use crate::budget::records::ResponseRecord;
use crate::budget::StoreError;

/// Records in Redis.
pub struct RedisRecords {
    url: String,
    prefix: String,
    timeout: Duration,
    ttl: Duration,
    conn: OnceCell<Conn>,
}

impl RedisRecords {
    /// Records at `url` under `prefix`, each kept `ttl`; every call bounded by `timeout`.
    pub fn new(url: &str, prefix: &str, timeout: Duration, ttl: Duration) -> Self {
        Self {
            url: url.to_string(),
            prefix: prefix.to_string(),
            timeout,
            ttl,
            conn: OnceCell::new(),
        }
    }

    /// The key of `id` ([`keys::response_record`]).
    pub fn key(&self, id: &str) -> String {
        keys::response_record(&self.prefix, id)
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        self.conn
            .get_or_try_init(|| Conn::open(&self.url, self.timeout))
            .await
            .cloned()
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, redis::RedisError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, f)
            .await
            .map_err(|_| StoreError::Timeout)?
            .map_err(map_err)
    }

    /// The record of `id`.
    pub async fn get(&self, id: &str) -> Result<Option<ResponseRecord>, StoreError> {
        let mut c = self.conn().await?;
        let v: Option<String> = self.bounded(c.get(self.key(id))).await?;
        Ok(v.as_deref().and_then(ResponseRecord::decode))
    }

    /// Writes the record of `id` with the TTL.
    pub async fn put(&self, id: &str, record: &ResponseRecord) -> Result<(), StoreError> {
        let mut c = self.conn().await?;
        let opts = redis::SetOptions::default()
            .with_expiration(redis::SetExpiry::PX(self.ttl.as_millis() as u64));
        self.bounded(c.set_options::<_, _, ()>(self.key(id), record.encode(), opts))
            .await
    }

    /// Deletes the record of `id`.
    pub async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let mut c = self.conn().await?;
        self.bounded(c.del::<_, ()>(self.key(id))).await
    }
}
