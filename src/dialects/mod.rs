//! API dialects: what differs between the API surfaces the gateway serves.
//!
//! - [`error`]: the error body shape, for HTTP, admin and SSE errors.

pub mod error;
