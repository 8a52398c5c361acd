//! tollgate-server (being built).
