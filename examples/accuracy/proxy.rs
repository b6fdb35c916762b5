//! A local TCP proxy in front of a Redis primary, re-pointed at its
//! replica by the failover scenario, as a cloud's failover endpoint is:
//! [`Proxy::cut`] drops every connection and refuses new ones (the primary
//! is gone); [`Proxy::point`] sends new connections to another port.

use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

#[derive(Default)]
struct State {
    target: Option<u16>,
    conns: Vec<AbortHandle>,
}

pub struct Proxy {
    pub port: u16,
    state: Arc<Mutex<State>>,
    accept: AbortHandle,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Proxy {
    pub async fn start(target: u16) -> Result<Proxy, String> {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        let state = Arc::new(Mutex::new(State {
            target: Some(target),
            conns: Vec::new(),
        }));
        let st = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = l.accept().await {
                let target = lock(&st).target;
                let Some(target) = target else {
                    drop(client);
                    continue;
                };
                let task = tokio::spawn(async move {
                    let Ok(upstream) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = upstream.set_nodelay(true);
                    let (mut a, mut b) = (client, upstream);
                    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                });
                let mut s = lock(&st);
                s.conns.retain(|c| !c.is_finished());
                s.conns.push(task.abort_handle());
            }
        });
        Ok(Proxy {
            port,
            state,
            accept: accept.abort_handle(),
        })
    }

    /// Drops every open connection and refuses new ones.
    pub fn cut(&self) {
        let mut s = lock(&self.state);
        s.target = None;
        for c in s.conns.drain(..) {
            c.abort();
        }
    }

    /// New connections go to `port`.
    pub fn point(&self, port: u16) {
        lock(&self.state).target = Some(port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}
