//! tollgate-sim (being built).
