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

/// The decimal digits of `n` (ASCII, no leading zeros; `0` for zero), written into `buf`
/// without the formatting machinery: the part of `buf` they fill. For text built on a hot
/// path (a bucket key's shard, a pass's pair names).
pub fn decimal_digits(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    let mut n = n;
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[at..]
}

/// The bucket item of (entity, resource, shard).
pub fn bucket(ns: &str, entity: &str, resource: &str, shard: u32) -> Key {
    // This runs on every read of a shard: the text is joined on the stack (no formatting
    // machinery, no growth checks per part) and shared in one allocation.
    let mut digits = [0u8; 20];
    let shard_digits = decimal_digits(u64::from(shard), &mut digits);
    let parts = [
        ns.as_bytes(),
        b"/BUCKET#",
        entity.as_bytes(),
        b"#",
        resource.as_bytes(),
        b"#",
        shard_digits,
    ];
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut text = [0u8; 128];
    let joined = text.get_mut(..len).map(|out| {
        let mut end = 0;
        for p in parts {
            out[end..end + p.len()].copy_from_slice(p);
            end += p.len();
        }
        &*out
    });
    let pk = match joined.map(std::str::from_utf8) {
        Some(Ok(s)) => Arc::from(s),
        // Longer than the buffer (or, unreachable, not UTF-8: only `str`s and ASCII digits
        // were joined).
        _ => shared_text(format_args!("{ns}/BUCKET#{entity}#{resource}#{shard}")),
    };
    let key = Key { pk, sk: state_sk() };
    debug_assert!(is_bucket(&key, ns, entity, resource, shard));
    key
}

/// Whether `key` is the bucket item of (entity, resource, shard) in `ns` — what
/// [`bucket`] builds — read without building it.
pub fn is_bucket(key: &Key, ns: &str, entity: &str, resource: &str, shard: u32) -> bool {
    let rest = key
        .pk
        .strip_prefix(ns)
        .and_then(|r| r.strip_prefix("/BUCKET#"))
        .and_then(|r| r.strip_prefix(entity))
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|r| r.strip_prefix(resource))
        .and_then(|r| r.strip_prefix('#'));
    &*key.sk == STATE
        && rest.is_some_and(|digits| {
            digits.parse::<u32>().ok() == Some(shard)
                && !digits.starts_with('+')
                && (digits == "0" || !digits.starts_with('0'))
        })
}

/// `args` formatted as shared text in one allocation: formatted on the stack first (up to
/// 128 bytes; longer text is formatted on the heap, then shared), where `Arc::from` a
/// `format!`ed string allocates twice.
pub fn shared_text(args: std::fmt::Arguments<'_>) -> Arc<str> {
    /// Bytes formatted on the stack.
    struct Stack(SmallVec<[u8; 128]>);
    impl std::fmt::Write for Stack {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.extend_from_slice(s.as_bytes());
            Ok(())
        }
    }
    if let Some(s) = args.as_str() {
        return Arc::from(s);
    }
    let mut out = Stack(SmallVec::new());
    if std::fmt::write(&mut out, args).is_ok() {
        // Only `str`s were written: the bytes are text.
        if let Ok(s) = std::str::from_utf8(&out.0) {
            return Arc::from(s);
        }
    }
    Arc::from(std::fmt::format(args))
}

/// [`STATE`], shared: every bucket key's sort key is one allocation made once.
pub fn state_sk() -> Arc<str> {
    static SK: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(STATE));
    Arc::clone(&SK)
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
    joined(&[ns, "/RESOURCE#", resource])
}

/// `parts` one after another, in one allocation of the exact size: what `format!` builds
/// from plain texts, without its formatting machinery (the aggregator builds several of
/// these for every snapshot item it writes).
pub fn joined(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
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

    #[test]
    fn decimal_digits_are_the_formatted_ones() {
        let mut buf = [0u8; 20];
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(decimal_digits(n, &mut buf), n.to_string().as_bytes());
        }
    }

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

    /// A bucket key is the formatted text, and `is_bucket` recognises exactly it.
    #[test]
    fn bucket_keys_are_the_formatted_text() {
        // Texts up to the stack buffer's 128 bytes, at it, and past it.
        let edge = "e".repeat(128 - "ns/BUCKET#".len() - "#r#9".len());
        let past = format!("{edge}x");
        let long = "é".repeat(200);
        for (e, r, s) in [
            ("user-1", "api", 0),
            ("é#x", "r", 31),
            ("", "", 4_000_000_000),
            (edge.as_str(), "r", 9),
            (past.as_str(), "r", 9),
            (long.as_str(), "gpt-4", 17),
        ] {
            let k = bucket("ns", e, r, s);
            assert_eq!(*k.pk, format!("ns/BUCKET#{e}#{r}#{s}"));
            assert_eq!(&*k.sk, STATE);
            assert!(is_bucket(&k, "ns", e, r, s));
            assert!(!is_bucket(&k, "ns", e, r, s.wrapping_add(1)));
            assert!(!is_bucket(&k, "nt", e, r, s));
        }
        let padded = Key::new("ns/BUCKET#e#r#01", STATE);
        assert!(!is_bucket(&padded, "ns", "e", "r", 1));
    }

    /// Shared text is the formatted text, on the stack or past it.
    #[test]
    fn shared_text_is_the_formatted_text() {
        let long = "x".repeat(300);
        for part in ["", "é-ü", "user-1", long.as_str()] {
            let got = shared_text(format_args!("ns/{part}#{}", 42));
            assert_eq!(*got, format!("ns/{part}#42"));
        }
        assert_eq!(&*shared_text(format_args!("plain")), "plain");
    }
}
