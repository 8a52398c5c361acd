//! Key layout (spec-shards-windows-quotas.md §2), under a namespace `ns`.

use std::sync::{Arc, LazyLock};

use smallvec::SmallVec;

use crate::value::Key;

/// Sort key of a bucket item.
pub const STATE: &str = "#STATE";
/// Sort key of an entity's META item.
pub const META: &str = "#META";
/// Resource name used for an entity's default config.
pub const DEFAULT_RESOURCE: &str = "_default_";

/// The bucket item of (entity, resource, shard).
pub fn bucket(ns: &str, entity: &str, resource: &str, shard: u32) -> Key {
    // Built by appending on the stack (this runs on every acquire), then shared in one
    // allocation: the same text as `format!("{ns}/BUCKET#{entity}#{resource}#{shard}")`.
    let mut pk: SmallVec<[u8; 128]> = SmallVec::new();
    pk.extend_from_slice(ns.as_bytes());
    pk.extend_from_slice(b"/BUCKET#");
    pk.extend_from_slice(entity.as_bytes());
    pk.push(b'#');
    pk.extend_from_slice(resource.as_bytes());
    pk.push(b'#');
    push_decimal(&mut pk, shard);
    let pk: Arc<str> = match std::str::from_utf8(&pk) {
        Ok(s) => Arc::from(s),
        // Unreachable: every part is text and the digits are ASCII.
        Err(_) => Arc::from(format!("{ns}/BUCKET#{entity}#{resource}#{shard}")),
    };
    Key { pk, sk: state_sk() }
}

/// [`STATE`], shared: every bucket key's sort key is one allocation made once.
pub fn state_sk() -> Arc<str> {
    static SK: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(STATE));
    Arc::clone(&SK)
}

/// Append `n` in decimal.
fn push_decimal(out: &mut SmallVec<[u8; 128]>, n: u32) {
    let mut digits = [0u8; 10];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The META item of an entity.
pub fn entity_meta(ns: &str, entity: &str) -> Key {
    Key::new(format!("{ns}/ENTITY#{entity}"), META)
}

/// The partition of an entity (META, configs).
pub fn entity_pk(ns: &str, entity: &str) -> String {
    format!("{ns}/ENTITY#{entity}")
}

/// An entity's limit config for a resource (`_default_` for all its resources).
pub fn entity_config(ns: &str, entity: &str, resource: &str) -> Key {
    Key::new(entity_pk(ns, entity), format!("#CONFIG#{resource}"))
}

/// A resource's default limit config.
pub fn resource_config(ns: &str, resource: &str) -> Key {
    Key::new(format!("{ns}/RESOURCE#{resource}"), "#CONFIG")
}

/// The system default config.
pub fn system_config(ns: &str) -> Key {
    Key::new(format!("{ns}/SYSTEM#"), "#CONFIG")
}

/// The reserved namespace of the namespace registry (spec-base-system.md §7.3).
pub const REGISTRY_NS: &str = "_";

/// The partition of the namespace registry.
pub fn registry_pk() -> String {
    format!("{REGISTRY_NS}/SYSTEM#")
}

/// A namespace's forward record (name → id), present while it is active.
pub fn namespace_forward(name: &str) -> Key {
    Key::new(registry_pk(), format!("#NAMESPACE#{name}"))
}

/// Sort-key prefix of the namespaces' reverse records.
pub const NSID_PREFIX: &str = "#NSID#";

/// A namespace's reverse record (id → name, status), kept from registration to purge.
pub fn namespace_reverse(id: &str) -> Key {
    Key::new(registry_pk(), format!("{NSID_PREFIX}{id}"))
}

/// The audit partition of one namespace's registry changes (in the registry namespace,
/// so a purge of the namespace keeps them).
pub fn audit_namespace_pk(name: &str) -> String {
    format!("{REGISTRY_NS}/AUDIT#NAMESPACE#{name}")
}

/// Sort key of a lease's closure record.
pub const CLOSED: &str = "#CLOSED";

/// The closure record of a shared lease (its id is 32 hex digits): written once, by the
/// commit or rollback that closes the lease, wherever it runs.
pub fn lease_closure(ns: &str, lease_id: &str) -> Key {
    Key::new(format!("{ns}/LEASE#{lease_id}"), CLOSED)
}

/// GSI3 partition of an entity's buckets (`BUCKET#{resource}#{shard}` sort keys).
pub fn gsi3_entity(ns: &str, entity: &str) -> String {
    format!("{ns}/ENTITY#{entity}")
}

/// GSI2 partition of a resource's buckets.
pub fn gsi2_resource(ns: &str, resource: &str) -> String {
    format!("{ns}/RESOURCE#{resource}")
}

/// GSI1 partition of a parent's children.
pub fn gsi1_parent(ns: &str, parent: &str) -> String {
    format!("{ns}/PARENT#{parent}")
}

/// Sort-key prefix of audit records (`#AUDIT#{ulid}`: newest last in key order).
pub const AUDIT_SK_PREFIX: &str = "#AUDIT#";

/// The audit partition of one entity's changes (its META, configs and buckets). Apart from
/// the entity's own partition, so deleting an entity keeps its history.
pub fn audit_entity_pk(ns: &str, entity: &str) -> String {
    format!("{ns}/AUDIT#ENTITY#{entity}")
}

/// The audit partition of one resource's default limits.
pub fn audit_resource_pk(ns: &str, resource: &str) -> String {
    format!("{ns}/AUDIT#RESOURCE#{resource}")
}

/// The audit partition of the system defaults.
pub fn audit_system_pk(ns: &str) -> String {
    format!("{ns}/AUDIT#SYSTEM")
}

/// One audit record in its target's partition.
pub fn audit_record(pk: String, id: &str) -> Key {
    Key::new(pk, format!("{AUDIT_SK_PREFIX}{id}"))
}

/// GSI1 partition holding every audit record of a namespace (sort key `AUDIT#{ulid}`):
/// one query lists them all. Administrative writes are rare, so one partition carries them.
pub fn gsi1_audit(ns: &str) -> String {
    format!("{ns}/AUDIT")
}

/// GSI1 sort-key prefix of audit records.
pub const GSI1_AUDIT_PREFIX: &str = "AUDIT#";

/// Per-limit bucket attribute `b_{limit}_{field}`.
pub fn battr(limit: &str, field: &str) -> String {
    // Appended rather than formatted: this runs for every attribute of every write.
    let mut a = String::with_capacity(limit.len() + field.len() + 3);
    a.push_str("b_");
    a.push_str(limit);
    a.push('_');
    a.push_str(field);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S1: bucket key and contents layout.
    #[test]
    fn bucket_keys() {
        let k = bucket("ns", "e", "gpt-4", 0);
        assert_eq!(&*k.pk, "ns/BUCKET#e#gpt-4#0");
        assert_eq!(&*k.sk, "#STATE");
        assert_ne!(bucket("ns", "e", "gpt-4", 1).pk, k.pk);
        assert_eq!(battr("session", "tk"), "b_session_tk");
        for s in [0, 7, 10, 99, 1234, u32::MAX] {
            assert_eq!(*bucket("n", "e", "r", s).pk, format!("n/BUCKET#e#r#{s}"));
        }
    }
}
