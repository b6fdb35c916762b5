//! What a request holds once admitted, and the store layers that admit it.
//!
//! - [`held`]: [`HeldReservation`], a reservation as a value: it extends
//!   (recording what was granted), settles once, and its `Drop` is the
//!   backstop that settles on every exit path.
//! - [`slot_renewal`]: one task renewing the slot leases of all live reservations; a
//!   lease is released when its handle is dropped.
//! - [`amounts`]: what a request costs each budget, at reserve, extend
//!   and settle (one pure function of the usage breakdown).
//! - [`plan`]: which budgets a request touches, from policy.
//! - [`tracker`]: settlements as tracked tasks, drained at shutdown, and
//!   the shutdown cutoff.
//! - [`deny`] and [`fail_open`]: the deny cache and the failure policy as
//!   wrappers around the guarded store, composed once into the
//!   [`GatewayStore`] every request reserves through.
//! - [`deny_release`]: the settlement observer that clears the deny
//!   cache's entries of a hold whose settlement refunded.
//! - [`expected`] and [`exposure`]: expected-output reservation (opt-in)
//!   and the per-budget exposure it may take.
//! - [`compensate`]: reservations whose reply was lost, settled under their
//!   own id when the request ends (DESIGN section 13).
//!
//! Nothing outside this module calls the raw budget store for a held
//! reservation.

pub mod amounts;
pub mod compensate;
pub mod deny;
pub mod deny_release;
pub mod expected;
pub mod exposure;
pub mod fail_open;
pub mod held;
pub mod plan;
pub mod quota_lease;
pub mod slot_renewal;
pub mod stream_cutoffs;
pub mod tracker;

pub use crate::settlement::DenyRelease;
pub use deny::AnsweredBy;
pub use fail_open::GatewayStore;
pub use held::HeldReservation;
pub use tracker::SettlementTracker;
