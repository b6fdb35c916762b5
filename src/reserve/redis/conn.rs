//! The connection: one multiplexed connection (single node, reconnecting
//! through redis-rs's `ConnectionManager`) or a cluster connection, and how
//! redis-rs errors map to store errors.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::reserve::StoreError;

/// A single-node or cluster connection; both are cheap handles to one
/// multiplexed connection (set), cloned per call.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Connects to `url` (`redis://…` for one node, `redis+cluster://…` for
    /// a cluster), giving up after `timeout` or one second, whichever is longer.
    pub async fn open(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        // Reconnection attempts get more time than one call: a call that
        // times out is the caller's problem, a reconnect should still finish.
        let connect_timeout = timeout.max(Duration::from_secs(1));
        Ok(match cluster_nodes(url) {
            Some(nodes) => {
                let client = redis::cluster::ClusterClient::builder(nodes)
                    .connection_timeout(connect_timeout)
                    .build()
                    .map_err(map_err)?;
                let c = tokio::time::timeout(connect_timeout, client.get_async_connection())
                    .await
                    .map_err(|_| StoreError::Timeout)?
                    .map_err(map_err)?;
                Conn::Cluster(c)
            }
            None => {
                let client = redis::Client::open(url).map_err(map_err)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    // Calls are bounded by `bounded` (this store's timeout);
                    // a second timer per call would cost an eventfd write
                    // on the serving thread's runtime (see guarded.rs).
                    .set_response_timeout(None)
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                let c = tokio::time::timeout(
                    connect_timeout,
                    ConnectionManager::new_with_config(client, config),
                )
                .await
                .map_err(|_| StoreError::Timeout)?
                .map_err(map_err)?;
                Conn::Single(c)
            }
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Node URLs of a `redis+cluster://[user:pass@]h1:p1,h2:p2[/]` URL, or `None`
/// for a plain single-node URL. Credentials apply to every node.
pub fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+cluster://") {
        ("redis", r)
    } else if let Some(r) = url.strip_prefix("rediss+cluster://") {
        ("rediss", r)
    } else {
        return None;
    };
    let rest = rest.trim_end_matches('/');
    let (auth, hosts) = match rest.rfind('@') {
        Some(i) => (&rest[..=i], &rest[i + 1..]),
        None => ("", rest),
    };
    Some(
        hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}://{auth}{h}"))
            .collect(),
    )
}

pub fn map_err(e: RedisError) -> StoreError {
    if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.is_cluster_error()
    {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Protocol(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_become_node_lists() {
        assert_eq!(cluster_nodes("redis://127.0.0.1:7000/"), None);
        assert_eq!(
            cluster_nodes("redis+cluster://127.0.0.1:7001,127.0.0.1:7002/").unwrap(),
            vec!["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]
        );
        assert_eq!(
            cluster_nodes("redis+cluster://u:p@h1:1,h2:2").unwrap(),
            vec!["redis://u:p@h1:1", "redis://u:p@h2:2"]
        );
    }
}
