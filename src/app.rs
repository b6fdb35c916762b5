//! Wiring: build the store a policy asks for, bind, serve until shutdown.
//!
//! Graceful shutdown (SIGTERM or ctrl-c): stop accepting connections, let
//! in-flight requests and streams finish for up to `server.shutdown_grace_secs`,
//! then cut off the streams still running (a clean final chunk with
//! `finish_reason: "length"` and `[DONE]`) and end the requests still waiting
//! for their upstream (503), wait for every settlement, and return.
//! Hot reload (SIGHUP, file change) runs alongside ([`crate::config::reload`]).

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::clock::{Clock, SystemClock};
use crate::config::reload;
use crate::config::{Policy, StoreKind};
use crate::reserve::memory::MemoryStore;
use crate::reserve::redis::RedisStore;
use crate::reserve::BudgetStore;
use crate::server::{router, AppState};

/// Builds the store `policy` configures, reading time from `clock`.
pub async fn build_store(
    policy: &Policy,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn BudgetStore>, String> {
    match &policy.store.kind {
        StoreKind::Memory => Ok(Arc::new(MemoryStore::new(clock))),
        StoreKind::Redis { url } => {
            // Redis mode reads time from Redis TIME (one clock for the fleet), not `clock`.
            let store = RedisStore::from_policy(&policy.store)
                .await
                .map_err(|e| format!("store.url {url}: {e}"))?;
            Ok(Arc::new(store))
        }
    }
}

/// How long connections may take to close after the cutoff before the
/// server stops waiting for them (a client that stopped reading).
const AFTER_CUTOFF: Duration = Duration::from_secs(5);

/// Serves `state` on `listener` until `shutdown` resolves, then shuts down
/// gracefully: no new connections; in-flight requests and streams get
/// `server.shutdown_grace_secs` (of the policy active then) to finish; at the
/// deadline streams are cut off cleanly and unfinished requests answered
/// 503; finally waits for every settlement task.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let (began_tx, began_rx) = oneshot::channel::<()>();
    // Small SSE frames must leave at once: without TCP_NODELAY, Nagle's
    // algorithm and delayed ACKs hold each frame for up to ~40 ms.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = began_tx.send(());
        })
        .into_future();
    tokio::pin!(server);
    let result = tokio::select! {
        r = &mut server => r,
        Ok(()) = began_rx => drain(&state, &mut server).await,
    };
    let pending = state.settlements.pending();
    if pending > 0 {
        tracing::info!(pending, "waiting for settlements");
    }
    state.settlements.wait_idle().await;
    tracing::info!(
        settled = state.settlements.settled(),
        failed = state.settlements.failed(),
        "settlements drained; shutdown complete"
    );
    result
}

/// The graceful part of shutdown: waits for `server` (which no longer
/// accepts) up to the grace period, then cuts off what is left.
async fn drain(
    state: &AppState,
    server: &mut (impl std::future::Future<Output = std::io::Result<()>> + Unpin),
) -> std::io::Result<()> {
    let grace = state.policy.load().server.shutdown_grace;
    tracing::info!(
        grace_secs = grace.as_secs(),
        "shutting down: no new connections; in-flight requests and streams may finish"
    );
    if let Ok(r) = tokio::time::timeout(grace, &mut *server).await {
        tracing::info!("in-flight requests finished");
        return r;
    }
    tracing::warn!(
        grace_secs = grace.as_secs(),
        "shutdown grace period over: cutting off streams and ending requests still running"
    );
    state.settlements.begin_cutoff();
    match tokio::time::timeout(AFTER_CUTOFF, &mut *server).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!("connections still open after the cutoff; closing without them");
            Ok(())
        }
    }
}

/// Starts a gateway for `policy` on the system clock (the `serve` command),
/// reloading `config_path` on SIGHUP and on change.
pub async fn run(
    policy: Policy,
    listen: Option<std::net::SocketAddr>,
    config_path: std::path::PathBuf,
) -> Result<(), String> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = build_store(&policy, clock.clone()).await?;
    let addr = listen.unwrap_or(policy.server.listen);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(listen = %local, policy_version = %policy.version, "budgetgate listening");
    println!("budgetgate listening on http://{local}");
    let token_env = policy.server.admin_token_env.clone();
    let state = AppState::new(policy, store, clock);
    let token = std::env::var(&token_env).ok().filter(|t| !t.is_empty());
    if token.is_some() {
        tracing::info!(token_env = %token_env, "admin API enabled under /admin/v1/");
    } else {
        tracing::info!(token_env = %token_env, "admin API disabled (token variable unset)");
    }
    state.set_admin_token(token.as_deref());
    let reloader = {
        let st = state.clone();
        let path = config_path.clone();
        tokio::spawn(reload::watch(config_path, move |trigger| {
            reload::reload(&st.policy, &path, trigger);
        }))
    };
    let result = serve(listener, state, shutdown_signal()).await;
    reloader.abort();
    result.map_err(|e| e.to_string())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
