//! Client connections: accepted while fewer than `server.max_connections`
//! are open, served by hyper with a header read timeout and a write
//! timeout, drained gracefully at shutdown.
//!
//! - The bound is the process's, shared by its serving threads; its default
//!   is half of the file limit (`RLIMIT_NOFILE`) left after [`RESERVED_FDS`]
//!   for the store, the database, logs and the like: each client connection
//!   may hold an upstream connection too. [`Connections::new`] says which.
//! - At the bound, the oldest connection that has not sent a complete
//!   request yet (and had [`GRACE`] to) is closed to make room: a client
//!   that opened connections and sends nothing cannot keep a keyed client
//!   out. When every open connection has sent one, the new connection
//!   waits for a slot and the kernel's backlog holds the next ones.
//! - Out of file descriptors (`EMFILE`, `ENFILE`), the oldest connection
//!   without a request is closed and accepting retried at once; with none
//!   to close, every [`ACCEPT_RETRY`]. The error is logged at most once a
//!   second (with the count of those not logged).
//! - The header read timeout is hyper's: it runs from the moment hyper
//!   waits for a request's head, which on a kept-alive connection is right
//!   after the previous answer, so it is also the idle timeout.
//! - The write timeout ([`WriteTimeout`]) ends a connection whose writes
//!   made no progress for that long (a client that stopped reading); its
//!   stream, if any, settles what it delivered as the client's leaving.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use futures_util::task::AtomicWaker;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use crate::config::ConnectionLimits;

/// File descriptors the default bound leaves to everything but client
/// connections and their upstream connections.
pub const RESERVED_FDS: u64 = 64;

/// The smallest default bound, whatever the file limit.
const MIN_DEFAULT: u64 = 16;

/// How soon accepting is retried after an error other than a failed
/// client connection (out of descriptors, out of memory).
pub const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// How long a new connection may go without a complete request head
/// before it may be closed to make room (a client sends its head right
/// after connecting; the header read timeout is the upper bound).
pub const GRACE: Duration = Duration::from_millis(500);

/// What [`Connections::close_oldest_unproven`] did.
enum Closing {
    Closed,
    /// The oldest may be closed from then on.
    TooYoung(Instant),
    None,
}

/// The client connections of a gateway, across its serving threads.
pub struct Connections {
    slots: Arc<Semaphore>,
    max: usize,
    /// Connections that have not sent a complete request yet, oldest first.
    /// Each with when it was accepted and its [`Signal`].
    unproven: Mutex<BTreeMap<u64, (Instant, Arc<Signal>)>>,
    next_id: AtomicU64,
    /// When an accept error was last logged, and how many since went unlogged.
    error_log: Mutex<(Option<Instant>, u64)>,
}

/// The process's soft file limit (`RLIMIT_NOFILE`); `None` if unlimited or unknown.
pub fn file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    (ok && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// The default bound for a file limit of `files`: half of what is left
/// after [`RESERVED_FDS`], at least [`MIN_DEFAULT`].
pub fn default_max(files: Option<u64>) -> usize {
    let files = files.unwrap_or(1 << 20);
    (files.saturating_sub(RESERVED_FDS) / 2).max(MIN_DEFAULT) as usize
}

impl Connections {
    /// A bound of `limits.max_connections`, or the default for the
    /// process's file limit; logs which.
    pub fn new(limits: &ConnectionLimits) -> Arc<Connections> {
        let files = file_limit();
        let max = limits.max_connections.unwrap_or_else(|| default_max(files));
        let file_limit = files.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
        let source = if limits.max_connections.is_some() {
            "server.max_connections"
        } else {
            "default: half the file limit left after 64"
        };
        tracing::info!(max_connections = max, %file_limit, source,
            header_read_timeout_secs = limits.header_read_timeout.as_secs(),
            write_timeout_secs = limits.write_timeout.as_secs(),
            "client connections bounded");
        if files.is_some_and(|f| max as u64 > f) {
            tracing::warn!(max_connections = max, %file_limit,
                "server.max_connections is above the file limit: accepting will fail for want of descriptors before the bound");
        }
        crate::metrics::connections_max(max);
        Arc::new(Connections {
            slots: Arc::new(Semaphore::new(max)),
            max,
            unproven: Mutex::default(),
            next_id: AtomicU64::new(0),
            error_log: Mutex::new((None, 0)),
        })
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// Accepts the next client of `tcp` and takes a slot for it (see the
    /// module docs for the bound and for errors).
    pub async fn accept(&self, tcp: &TcpListener) -> (TcpStream, SocketAddr, Slot) {
        loop {
            match tcp.accept().await {
                Ok((stream, peer)) => return (stream, peer, self.slot().await),
                Err(e) if is_client_error(&e) => continue,
                Err(e) => {
                    self.accept_failed(&e);
                    if !is_out_of_files(&e) {
                        tokio::time::sleep(ACCEPT_RETRY).await;
                        continue;
                    }
                    match self.close_oldest_unproven() {
                        // Its task closes its descriptor when it next runs.
                        Closing::Closed => tokio::task::yield_now().await,
                        Closing::TooYoung(at) => {
                            tokio::time::sleep_until(at.min(Instant::now() + ACCEPT_RETRY)).await
                        }
                        Closing::None => tokio::time::sleep(ACCEPT_RETRY).await,
                    }
                }
            }
        }
    }

    /// A slot for a connection just accepted: at the bound, the oldest
    /// connection without a request is closed to make room (once it had
    /// [`GRACE`]); without one, the first slot given back.
    async fn slot(&self) -> Slot {
        loop {
            if let Ok(permit) = self.slots.clone().try_acquire_owned() {
                crate::metrics::connections_open(1.0);
                return Slot { _permit: permit };
            }
            let look_again = match self.close_oldest_unproven() {
                Closing::Closed => None,
                Closing::TooYoung(at) => Some(at),
                Closing::None => Some(Instant::now() + GRACE),
            };
            let permit = tokio::select! {
                p = self.slots.clone().acquire_owned() => p,
                _ = async {
                    match look_again {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => continue,
            };
            // The semaphore is never closed.
            if let Ok(permit) = permit {
                crate::metrics::connections_open(1.0);
                return Slot { _permit: permit };
            }
        }
    }

    /// Closes the oldest connection that has not sent a complete request,
    /// if it had [`GRACE`] to send one.
    fn close_oldest_unproven(&self) -> Closing {
        let mut unproven = lock(&self.unproven);
        let Some(entry) = unproven.first_entry() else {
            return Closing::None;
        };
        let evictable_at = entry.get().0 + GRACE;
        if evictable_at > Instant::now() {
            return Closing::TooYoung(evictable_at);
        }
        let (_, signal) = entry.remove();
        drop(unproven);
        crate::metrics::connection_closed("evicted");
        signal.raise(CLOSE);
        Closing::Closed
    }

    fn accept_failed(&self, e: &io::Error) {
        crate::metrics::accept_error();
        let mut log = lock(&self.error_log);
        let now = Instant::now();
        if log.0.is_some_and(|at| now - at < Duration::from_secs(1)) {
            log.1 += 1;
            return;
        }
        let unlogged = std::mem::take(&mut log.1);
        log.0 = Some(now);
        drop(log);
        tracing::error!(error = %e, unlogged, open = self.open(),
            "accept error; retrying (logged at most once a second)");
    }

    /// Registers a new connection, with its `signal`, as not having sent
    /// a request.
    fn register(self: &Arc<Self>, signal: &Arc<Signal>) -> Proof {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.unproven).insert(id, (Instant::now(), signal.clone()));
        Proof {
            connections: self.clone(),
            id,
            proven: AtomicBool::new(false),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection's place under the bound, given back when dropped.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        crate::metrics::connections_open(-1.0);
    }
}

/// Takes a connection off the unproven list at its first request (or its end).
struct Proof {
    connections: Arc<Connections>,
    id: u64,
    proven: AtomicBool,
}

impl Proof {
    fn request_started(&self) {
        if !self.proven.load(Ordering::Relaxed) && !self.proven.swap(true, Ordering::Relaxed) {
            lock(&self.connections.unproven).remove(&self.id);
        }
    }
}

impl Drop for Proof {
    fn drop(&mut self) {
        if !*self.proven.get_mut() {
            lock(&self.connections.unproven).remove(&self.id);
        }
    }
}

/// A failed connection of one client: accepting goes on at once.
fn is_client_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

fn is_out_of_files(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// A connection a listener handed over, with its slot.
pub struct Accepted<I> {
    pub io: I,
    pub peer: SocketAddr,
    pub slot: Slot,
}

/// Where connections come from: plain TCP, or TLS handshaken off the accept path.
pub trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&mut self) -> impl Future<Output = Accepted<Self::Io>> + Send;
}

/// Plain TCP, with `TCP_NODELAY`: small SSE frames must leave at once
/// (without it, Nagle's algorithm and delayed ACKs hold each frame for up
/// to ~40 ms).
pub struct PlainListener {
    pub tcp: TcpListener,
    pub connections: Arc<Connections>,
}

impl Accept for PlainListener {
    type Io = TcpStream;

    async fn accept(&mut self) -> Accepted<TcpStream> {
        let (io, peer, slot) = self.connections.accept(&self.tcp).await;
        let _ = io.set_nodelay(true);
        Accepted { io, peer, slot }
    }
}

/// Serves the connections of `listener` with `app` until `shutdown`
/// resolves, then lets each connection finish what it is doing (no new
/// request is read) and returns when all are closed. `limits` is read for
/// each new connection (its timeouts follow reloads).
pub async fn serve<A: Accept>(
    mut listener: A,
    app: Router,
    connections: Arc<Connections>,
    limits: impl Fn() -> ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let open = Arc::new(Open::default());
    let (open_tx, open_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut shutdown => break,
        };
        spawn_connection(
            accepted,
            app.clone(),
            &connections,
            limits(),
            &open,
            open_rx.clone(),
        );
    }
    drop(listener);
    // Every connection of this listener is in `open` (each is entered
    // before its task is spawned, and none is spawned from here on).
    for signal in lock(&open.signals).values() {
        signal.raise(DRAIN);
    }
    drop(open_rx);
    open_tx.closed().await;
    Ok(())
}

/// [`Signal::raise`]: finish the request in flight, then close (the
/// gateway shuts down).
const DRAIN: u8 = 1;
/// [`Signal::raise`]: close now (evicted to make room).
const CLOSE: u8 = 2;

/// What a connection's task is told from outside: [`DRAIN`], [`CLOSE`].
/// Its task reads one atomic on each wake; a `watch` and a `Notify` in a
/// `select!` took a lock of their waiter lists each, on every wake.
#[derive(Default)]
struct Signal {
    raised: AtomicU8,
    waker: AtomicWaker,
}

impl Signal {
    /// Raises `what`; the task is woken when that changes what is raised
    /// (each wake takes the registered waker: see `spawn_connection`).
    fn raise(&self, what: u8) {
        if self.raised.fetch_or(what, Ordering::Release) & what == 0 {
            self.waker.wake();
        }
    }
}

/// The connections of one listener, to be drained at shutdown.
#[derive(Default)]
struct Open {
    signals: Mutex<BTreeMap<u64, Arc<Signal>>>,
}

/// Takes a connection out of [`Open`] when its task ends.
struct Entered {
    open: Arc<Open>,
    id: u64,
    /// Held until the connection is closed: `serve` waits for the last.
    _open_rx: watch::Receiver<()>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        lock(&self.open.signals).remove(&self.id);
    }
}

fn spawn_connection<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    accepted: Accepted<I>,
    app: Router,
    connections: &Arc<Connections>,
    limits: ConnectionLimits,
    open: &Arc<Open>,
    open_rx: watch::Receiver<()>,
) {
    let signal = Arc::new(Signal::default());
    let proof = connections.register(&signal);
    lock(&open.signals).insert(proof.id, signal.clone());
    let entered = Entered {
        open: open.clone(),
        id: proof.id,
        _open_rx: open_rx,
    };
    let Accepted { io, peer, slot } = accepted;
    let io = TokioIo::new(WriteTimeout::new(io, limits.write_timeout));
    let proof = Arc::new(proof);
    let service = {
        let proof = proof.clone();
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            proof.request_started();
            app.clone().oneshot(req)
        })
    };
    tokio::spawn(async move {
        let _slot = slot;
        let _entered = entered;
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(HeadTimer::default())
            .header_read_timeout(limits.header_read_timeout);
        builder.http2().timer(TokioTimer::new());
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);
        let mut draining = false;
        // The waker registered with the signal, and what was raised when it
        // was: a raise takes the registered waker, so a change seen means
        // registering again. Otherwise the task's waker, the same on every
        // wake, is registered once (registering costs two atomic swaps).
        let mut registered: Option<(std::task::Waker, u8)> = None;
        let served = std::future::poll_fn(|cx| {
            // Read again after registering: a signal raised in between may
            // have found no waker.
            let mut raised = signal.raised.load(Ordering::Acquire);
            while !registered
                .as_ref()
                .is_some_and(|(w, seen)| *seen == raised && w.will_wake(cx.waker()))
            {
                signal.waker.register(cx.waker());
                registered = Some((cx.waker().clone(), raised));
                raised = signal.raised.load(Ordering::Acquire);
            }
            if raised & CLOSE != 0 {
                // Closed to make room (counted where it was chosen).
                return Poll::Ready(None);
            }
            if raised & DRAIN != 0 && !draining {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            conn.as_mut().poll(cx).map(Some)
        })
        .await;
        if let Some(Err(e)) = served {
            closed_by_error(&*e, peer);
        }
        drop(proof);
    });
}

/// hyper's timer for the header read timeout of one HTTP/1 connection.
/// hyper asks for a new sleep for each request head; a tokio timer each
/// was a timer-wheel insert and removal per request. The sleeps of one
/// connection share one tokio timer instead: a head read in time leaves
/// it where it is, and it is moved only when it fires before the deadline
/// of the head being read (at most once per timeout). A timer left behind
/// by a head read in time wakes the connection's task once for nothing.
#[derive(Clone, Default)]
struct HeadTimer {
    shared: Arc<Mutex<SharedSleep>>,
}

#[derive(Default)]
struct SharedSleep {
    sleep: Option<Pin<Box<Sleep>>>,
    /// The waker the pending timer wakes (`None`: not pending).
    waker: Option<std::task::Waker>,
}

/// A head's deadline on its connection's [`HeadTimer`].
struct HeadDeadline {
    shared: Arc<Mutex<SharedSleep>>,
    deadline: Instant,
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until((Instant::now() + duration).into_std())
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HeadDeadline {
            shared: self.shared.clone(),
            deadline: deadline.into(),
        })
    }

    // The tokio clock (paused in tests), as hyper-util's `TokioTimer`.
    fn now(&self) -> std::time::Instant {
        Instant::now().into_std()
    }
}

impl Future for HeadDeadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let mut shared = lock(&self.shared);
        let SharedSleep { sleep, waker } = &mut *shared;
        // Pending for this task, due no later than this deadline: it wakes
        // the task then, polled again or not.
        if let (Some(sleep), Some(w)) = (&*sleep, &*waker) {
            if sleep.deadline() <= deadline && w.will_wake(cx.waker()) && !sleep.is_elapsed() {
                return Poll::Pending;
            }
        }
        let sleep = sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *waker = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            if sleep.deadline() >= deadline {
                *waker = None;
                return Poll::Ready(());
            }
            // Left at an earlier head's deadline.
            sleep.as_mut().reset(deadline);
        }
    }
}

impl hyper::rt::Sleep for HeadDeadline {}

/// Counts a connection ended by a timeout; logs the others at debug.
fn closed_by_error(e: &(dyn std::error::Error + 'static), peer: SocketAddr) {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            if h.is_timeout() {
                crate::metrics::connection_closed("header_timeout");
                tracing::debug!(%peer, "connection closed: no complete request head within server.header_read_timeout_secs");
                return;
            }
        }
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::TimedOut {
                crate::metrics::connection_closed("write_timeout");
                tracing::debug!(%peer, "connection closed: the client took no bytes within server.write_timeout_secs");
                return;
            }
        }
        source = err.source();
    }
    tracing::debug!(%peer, error = %e, "connection ended with an error");
}

/// An I/O stream whose writes fail with `TimedOut` once they made no
/// progress for `timeout`. The timer is armed only while a write waits:
/// a write the socket takes at once costs a flag.
pub struct WriteTimeout<I> {
    io: I,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl<I> WriteTimeout<I> {
    pub fn new(io: I, timeout: Duration) -> Self {
        WriteTimeout {
            io,
            timeout,
            stalled: None,
            armed: false,
        }
    }

    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.armed = false;
            return r;
        }
        if !self.armed {
            self.armed = true;
            let at = Instant::now() + self.timeout;
            match &mut self.stalled {
                Some(sleep) => sleep.as_mut().reset(at),
                None => self.stalled = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        let timed_out = match &mut self.stalled {
            Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
            None => false,
        };
        if !timed_out {
            return Poll::Pending;
        }
        self.armed = false;
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client took no bytes within the write timeout",
        )))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteTimeout<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_bound_is_half_the_file_limit_left_after_the_reserve() {
        assert_eq!(default_max(Some(1024)), 480);
        assert_eq!(default_max(Some(256)), 96);
        assert_eq!(default_max(Some(10)), MIN_DEFAULT as usize);
        assert_eq!(default_max(None), ((1 << 20) - 64) / 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_makes_no_progress_times_out() {
        use tokio::io::AsyncWriteExt;
        // The peer never reads: the duplex buffer fills and writes wait.
        let (a, _b) = tokio::io::duplex(16);
        let mut io = WriteTimeout::new(a, Duration::from_secs(5));
        let started = Instant::now();
        let e = io.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_not_timed_out() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut b) = tokio::io::duplex(16);
        let mut io = WriteTimeout::new(a, Duration::from_secs(5));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let mut total = 0;
            while total < 160 {
                tokio::time::sleep(Duration::from_secs(3)).await;
                total += b.read(&mut buf).await.unwrap();
            }
        });
        io.write_all(&[0u8; 160]).await.unwrap();
        reader.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_deadline_holds_on_a_timer_left_at_an_earlier_heads() {
        use hyper::rt::Timer;
        let timer = HeadTimer::default();
        let start = Instant::now();
        // The first head comes in time: its sleep is polled once, then dropped.
        let mut first = timer.sleep_until((start + Duration::from_secs(3)).into_std());
        let pending = std::future::poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx).is_pending()));
        assert!(pending.await);
        drop(first);
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The next head's deadline is a second after the first's.
        timer
            .sleep_until((Instant::now() + Duration::from_secs(3)).into_std())
            .await;
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        // A head that never comes times out at its own deadline.
        let again = Instant::now();
        timer
            .sleep_until((again + Duration::from_secs(3)).into_std())
            .await;
        assert_eq!(again.elapsed(), Duration::from_secs(3));
    }

    /// A gateway-less `serve` on a loopback port: `GET /` answers "ok".
    /// Its shutdown is the sender's drop or send.
    async fn serving(
        header_read_timeout: Duration,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let limits = ConnectionLimits {
            header_read_timeout,
            write_timeout: Duration::from_secs(30),
            max_connections: Some(16),
        };
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let connections = Connections::new(&limits);
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let listener = PlainListener {
            tcp,
            connections: connections.clone(),
        };
        let served = tokio::spawn(serve(listener, app, connections, move || limits, async {
            let _ = stop_rx.await;
        }));
        (addr, stop_tx, served)
    }

    /// Sends `GET /` on `conn` and reads its whole answer.
    async fn get(conn: &mut TcpStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        conn.write_all(b"GET / HTTP/1.1\r\nhost: gateway\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while !answer.ends_with(b"\r\n\r\nok") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before its answer");
            answer.extend_from_slice(&buf[..n]);
        }
    }

    /// Reads `conn` to its end (at most `within`).
    async fn closed(conn: &mut TcpStream, within: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(within, conn.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn a_kept_alive_connection_idle_for_the_header_read_timeout_is_closed() {
        let timeout = Duration::from_millis(800);
        let (addr, _stop, _served) = serving(timeout).await;
        let mut conn = TcpStream::connect(addr).await.unwrap();
        get(&mut conn).await;
        // The second head comes before the first idle deadline: the
        // connection's timer fires then and moves to the second answer's.
        tokio::time::sleep(timeout / 2).await;
        get(&mut conn).await;
        let answered = std::time::Instant::now();
        assert!(closed(&mut conn, Duration::from_secs(5)).await);
        let idle = answered.elapsed();
        assert!(
            idle >= timeout - Duration::from_millis(50) && idle < Duration::from_secs(3),
            "closed after {idle:?} idle (header read timeout {timeout:?})"
        );
    }

    #[tokio::test]
    async fn shutdown_closes_idle_connections_and_serve_returns() {
        let (addr, stop, served) = serving(Duration::from_secs(60)).await;
        let mut conns = Vec::new();
        for _ in 0..3 {
            let mut conn = TcpStream::connect(addr).await.unwrap();
            get(&mut conn).await;
            conns.push(conn);
        }
        stop.send(()).unwrap();
        let returned = tokio::time::timeout(Duration::from_secs(5), served).await;
        assert!(
            matches!(returned, Ok(Ok(Ok(())))),
            "serve did not return: {returned:?}"
        );
        for conn in &mut conns {
            assert!(closed(conn, Duration::from_secs(1)).await);
        }
    }
}
