//! Limits as a reviewed file: one TOML document declaring every stored level (system,
//! resources, entities) and the Envoy descriptor mapping. `tollgate limits plan -f FILE`
//! diffs it against what the store holds now ([`Limiter::stored_levels`], [`plan`]),
//! `tollgate limits apply -f FILE` writes the difference ([`Limiter::apply_change`]),
//! `tollgate serve --limits FILE` does both at start, on SIGHUP and when the file changes.
//! The schema is documented in `docs/limits-file.md`; an example is `examples/limits.toml`.
//!
//! Rule "the file is the whole truth": a level stored but absent from the file is deleted
//! by `apply`; a level in the file replaces the stored one whole (levels do not merge).
//!
//! Rule "a bad file names its line and field": unknown keys, wrong types and limits that do
//! not validate are refused with the 1-based line and the dotted path of the field, and
//! nothing is applied.

mod descriptors;
mod diff;
mod model;

pub use descriptors::{
    resolve, Charge, DescriptorError, DescriptorRule, EnvoySettings, Source, DEGRADED_HEADER,
    LEASE_ENTRY, LEASE_HEADER,
};
pub use diff::{plan, Change, ChangeKind, Level, LimitChange, StoredLevels};
pub use model::{parse, LimitsFile, LimitsFileError, ScopeKey};
