//! tollgate-dynamodb (being built).
