//! Knowing that the gateway's last run ended in a crash (kill -9, power
//! loss), so reconciliation can name the rows it lost: while the ledger
//! runs, a marker file `ledger-run` in the state directory says when the
//! run started and how many rows its buffer may hold; a graceful shutdown
//! removes it once the buffer is written. A gateway that finds the marker
//! at start knows the previous run crashed and lost at most that many
//! rows (docs/LEDGER.md, "Crash loss bound"), settled between that run's
//! start and this one's.
//!
//! One gateway per state directory (as for the memory store's snapshot);
//! a marker that cannot be written only costs the naming of a crash.

use std::path::{Path, PathBuf};

/// The previous run, found unfinished at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Crash {
    /// When the crashed run started, UTC µs.
    pub started_micros: u64,
    /// When this run found its marker, UTC µs (the crash came before).
    pub found_micros: u64,
    /// The crashed run's buffer bound, rows: at most this many were lost.
    pub buffer_rows: u64,
}

/// This run's marker; removed by [`RunMarker::clean_end`].
#[derive(Debug)]
pub struct RunMarker {
    path: PathBuf,
}

/// The marker's name in the state directory.
pub const MARKER: &str = "ledger-run";

impl RunMarker {
    /// Writes this run's marker in `dir` (started at `now`, a buffer of
    /// `buffer_rows`), returning the previous run's crash if its marker
    /// was still there.
    pub fn begin(dir: &Path, now: u64, buffer_rows: usize) -> (Option<Self>, Option<Crash>) {
        let path = dir.join(MARKER);
        let crash = std::fs::read_to_string(&path).ok().and_then(|text| {
            let mut it = text.split_whitespace().map(|n| n.parse::<u64>().ok());
            match (it.next().flatten(), it.next().flatten()) {
                (Some(started_micros), Some(buffer_rows)) => Some(Crash {
                    started_micros,
                    found_micros: now,
                    buffer_rows,
                }),
                _ => None,
            }
        });
        if let Some(c) = &crash {
            tracing::warn!(
                started_micros = c.started_micros,
                at_most_rows = c.buffer_rows,
                "the previous run did not shut down gracefully: its buffered ledger rows were lost"
            );
        }
        let _ = std::fs::create_dir_all(dir);
        let marker = match std::fs::write(&path, format!("{now} {buffer_rows}\n")) {
            Ok(()) => Some(RunMarker { path }),
            Err(e) => {
                tracing::debug!(error = %e, "ledger run marker not written");
                None
            }
        };
        (marker, crash)
    }

    /// The run ended gracefully: nothing it buffered is lost.
    pub fn clean_end(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_left_behind_names_the_crash_and_a_clean_end_none() {
        let d = tempfile::tempdir().unwrap();
        let (m, crash) = RunMarker::begin(d.path(), 10, 600);
        assert_eq!(crash, None);
        // Killed: the marker stays.
        drop(m);
        let (m, crash) = RunMarker::begin(d.path(), 20, 700);
        assert_eq!(
            crash,
            Some(Crash {
                started_micros: 10,
                found_micros: 20,
                buffer_rows: 600
            })
        );
        m.unwrap().clean_end();
        assert_eq!(RunMarker::begin(d.path(), 30, 1).1, None);
    }
}
