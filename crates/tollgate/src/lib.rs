//! The tollgate limiter.
