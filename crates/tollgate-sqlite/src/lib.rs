//! tollgate-sqlite (being built).
