//! Threads that estimate large request bodies, at low CPU priority.
//!
//! Counting a never-seen 400 KB prompt takes ~20 ms of CPU. On tokio's
//! blocking pool it no longer stalled the serving thread, but it still
//! competed for the same cores at the same priority: small requests served
//! beside a stream of such prompts saw their p99 grow sevenfold (in the
//! benchmark's cold-prompt phase). These threads run at nice 10 (Linux: per thread), so the
//! scheduler gives serving threads about ten times their share of a busy
//! core (CFS weights 1024 vs 110); large prompts wait instead of small
//! requests.
//!
//! The pool holds one thread per available CPU, started on first use; jobs
//! queue in a channel.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Nice value of the pool's threads (0 is the default, 19 the lowest priority).
pub const NICE: i32 = 10;

static QUEUE: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

/// Runs `f` on a low-priority pool thread and returns its result; `None`
/// if no pool thread could be started or `f` panicked (the panic is
/// printed by the thread, like any panic).
pub async fn run<R, F>(f: F) -> Option<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let queue = QUEUE.get_or_init(start).as_ref()?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    queue.send(job).ok()?;
    rx.await.ok()
}

fn start() -> Option<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut started = 0;
    for i in 0..threads {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("budgetgate-estimate-{i}"))
            .spawn(move || {
                lower_priority();
                loop {
                    // A panic in a job poisons nothing of value: the lock only guards the receiver.
                    let job = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    };
                    // A panicking job must not take the thread with it.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            });
        if spawned.is_ok() {
            started += 1;
        }
    }
    (started > 0).then_some(tx)
}

/// Sets this thread's nice value to [`NICE`] (Linux applies it per thread).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take plain integers and touch no
        // memory of ours; a failure (returned -1) only leaves the priority as it was.
        let rc =
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, NICE) };
        if rc != 0 {
            tracing::debug!("could not lower the estimation thread's priority");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn runs_jobs_and_survives_a_panicking_one() {
        assert_eq!(run(|| 2 + 2).await, Some(4));
        let panicked: Option<u8> = run(|| panic!("job panics on purpose")).await;
        assert_eq!(panicked, None);
        // The pool still works afterwards, on every thread.
        for i in 0..16u64 {
            assert_eq!(run(move || i * 2).await, Some(i * 2));
        }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "current_thread")]
    async fn pool_threads_run_at_low_priority() {
        // SAFETY: getpriority reads an integer attribute of this thread.
        let nice =
            run(|| unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) })
                .await;
        assert_eq!(nice, Some(NICE));
    }
}
