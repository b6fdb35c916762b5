//! The connection: one multiplexed connection to a single node, replaced
//! when it dies ([`Link`]), or a cluster connection; and how redis-rs
//! errors map to store errors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, ProtocolVersion, PushInfo,
    PushKind, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

use crate::budget::StoreError;

/// A single-node or cluster connection; both are cheap handles to one
/// multiplexed connection (set), cloned per call.
#[derive(Clone)]
pub enum Conn {
    Single(Arc<Link>),
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
                let link = Link::new(url, connect_timeout)?;
                // Connect now: a wrong address or password fails start-up.
                link.get().await.map_err(map_err)?;
                Conn::Single(Arc::new(link))
            }
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(l) => Box::pin(l.call(cmd)),
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
            Conn::Single(l) => Box::pin(l.call_many(pipeline, offset, count)),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(l) => l.client.get_connection_info().redis_settings().db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// One node's connection: a multiplexed connection, replaced when it dies.
///
/// The connection speaks RESP3 so that its reader reports a closed socket
/// at once (a `Disconnection` push): the connection is marked dead then,
/// before any call is written to it, and the next call opens a new one
/// first. So a Redis restart fails only the calls made while Redis is
/// down, and a call that finds the connection dead was never written.
/// Each serving thread has its own link: one thread's reconnect never
/// waits on another's.
pub struct Link {
    client: redis::Client,
    connect_timeout: Duration,
    current: Mutex<Option<Live>>,
    /// One reconnect at a time; calls that arrive meanwhile wait for it.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Live {
    conn: MultiplexedConnection,
    alive: Arc<AtomicBool>,
}

impl Link {
    fn new(url: &str, connect_timeout: Duration) -> Result<Self, StoreError> {
        let info = url.into_connection_info().map_err(map_err)?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings)).map_err(map_err)?;
        Ok(Self {
            client,
            connect_timeout,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    fn live(&self) -> Option<Live> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current
            .as_ref()
            .filter(|l| l.alive.load(Ordering::Acquire))
            .cloned()
    }

    /// The live connection, or a new one.
    async fn get(&self) -> RedisResult<Live> {
        if let Some(l) = self.live() {
            return Ok(l);
        }
        let _turn = self.connecting.lock().await;
        if let Some(l) = self.live() {
            return Ok(l);
        }
        let alive = Arc::new(AtomicBool::new(true));
        let flag = alive.clone();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            // Calls are bounded by the store's own timeout; a second timer
            // per call would cost an eventfd write on the serving thread's
            // runtime (see guarded.rs).
            .set_response_timeout(None)
            .set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection {
                    flag.store(false, Ordering::Release);
                }
                Ok::<(), redis::aio::SendError>(())
            });
        let conn = match tokio::time::timeout(
            self.connect_timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        {
            Ok(c) => c?,
            Err(_) => return Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        };
        let live = Live { conn, alive };
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
        Ok(live)
    }

    async fn call(&self, cmd: &Cmd) -> RedisResult<Value> {
        let mut live = self.get().await.map_err(not_connected)?;
        let r = live.conn.send_packed_command(cmd).await;
        if let Err(e) = &r {
            if e.is_unrecoverable_error() || e.is_connection_dropped() {
                live.alive.store(false, Ordering::Release);
            }
        }
        r
    }

    async fn call_many(
        &self,
        p: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let mut live = self.get().await.map_err(not_connected)?;
        let r = live.conn.send_packed_commands(p, offset, count).await;
        if let Err(e) = &r {
            if e.is_unrecoverable_error() || e.is_connection_dropped() {
                live.alive.store(false, Ordering::Release);
            }
        }
        r
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

/// Marks a failure to get a connection: the call was never written.
const NOT_CONNECTED: &str = "budgetgate: not connected";

fn not_connected(e: RedisError) -> RedisError {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        format!("{NOT_CONNECTED}: {e}"),
    )
    .into()
}

pub fn map_err(e: RedisError) -> StoreError {
    if e.to_string().contains(NOT_CONNECTED) {
        return StoreError::NotSent(e.to_string());
    }
    if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        return StoreError::Unavailable(format!(
            "the Redis user lacks a permission budgetgate needs ({e}): it must be \
             allowed EVAL and EVALSHA (ACL category @scripting), TIME and the keys \
             of store.key_prefix; see docs/OPERATIONS.md"
        ));
    }
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
