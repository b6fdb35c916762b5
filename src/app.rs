//! Wiring: build the store a policy asks for, bind, serve until shutdown.

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::clock::{Clock, SystemClock};
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

/// Serves `state` on `listener` until `shutdown` resolves, then waits for
/// in-flight settlements.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    state.settlements.wait_idle().await;
    Ok(())
}

/// Starts a gateway for `policy` on the system clock (the `serve` command).
pub async fn run(
    policy: Policy,
    listen: Option<std::net::SocketAddr>,
    _config_path: std::path::PathBuf,
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
    let state = AppState::new(policy, store, clock);
    serve(listener, state, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
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
