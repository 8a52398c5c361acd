//! `tollgate doctor`: list the items the engine cannot read, naming the attribute, and say
//! which command repairs each (docs/repair.md). Exit 0 when none remain, 5 when some do.

use clap::Args;
use serde_json::json;
use tollgate::{CorruptItem, DoctorReport, ItemKind};

use crate::fail::Failure;
use crate::store::Access;
use crate::{print_json, StoreArgs};

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Also delete every bucket item of each entity / resource with a corrupt one (the next
    /// acquire creates them afresh, at full capacity). Corrupt limits and entities are left
    /// for `limits set`, `limits delete` and `entity delete`, which the report names.
    #[arg(long)]
    repair: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// The command that repairs an item of this kind.
pub(crate) fn repair_hint(kind: &ItemKind) -> String {
    let limits = |level: String| {
        format!(
            "`tollgate limits set {level} LIMIT...` replaces it; `tollgate limits delete {level}` deletes it"
        )
    };
    match kind {
        ItemKind::SystemLimits => limits("--system".into()),
        ItemKind::ResourceLimits { resource } => limits(format!("--resource {resource}")),
        ItemKind::EntityLimits {
            entity,
            resource: Some(r),
        } => limits(format!("--entity {entity} --for-resource {r}")),
        ItemKind::EntityLimits {
            entity,
            resource: None,
        } => limits(format!("--entity {entity}")),
        ItemKind::Entity { entity } => format!(
            "`tollgate entity delete {entity}` deletes the entity with its limits and buckets \
             (then `tollgate entity create {entity}`)"
        ),
        ItemKind::Bucket {
            entity, resource, ..
        } => format!(
            "`tollgate doctor --repair` deletes the buckets of {entity} / {resource} (they \
             restart full); `tollgate entity delete {entity}` deletes the whole entity"
        ),
        ItemKind::AuditRecord { .. } => "an audit record: `tollgate audit list` fails naming it \
             until it is deleted; no command rewrites it (its ttl expires it on DynamoDB)"
            .into(),
        ItemKind::Other => "not an item of tollgate's layout: nothing of tollgate reads it".into(),
    }
}

fn corrupt_json(c: &CorruptItem) -> serde_json::Value {
    let mut v = serde_json::to_value(c).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("message".into(), c.to_string().into());
        o.insert("repair".into(), repair_hint(&c.item).into());
    }
    v
}

pub(crate) async fn run(args: DoctorArgs, json: bool) -> Result<(), Failure> {
    let access = if args.repair {
        Access::Existing
    } else {
        Access::ReadOnly
    };
    let limiter = args.store.limiter(access).await?;
    let report = limiter.admin().doctor(args.repair).await?;
    let remaining = report.remaining().len();
    if json {
        print_json(&json!({
            "store": args.store.store.to_string(),
            "namespace": report.namespace,
            "scanned": report.scanned,
            "audit_records": report.audit_records,
            "unrecognised": report.unrecognised,
            "corrupt": report.corrupt.iter().map(corrupt_json).collect::<Vec<_>>(),
            "repaired": tollgate_server::warnings(&report.repaired),
            "remaining": remaining,
        }));
    } else {
        print_text(&report, &args.store.store.to_string());
    }
    if remaining == 0 {
        Ok(())
    } else {
        Err(Failure::CorruptFound(format!(
            "{remaining} corrupt item(s) remain in {}",
            args.store.store
        )))
    }
}

fn print_text(r: &DoctorReport, store: &str) {
    let n = r.corrupt.len();
    print!(
        "{store}, namespace {}: {} item(s) scanned, ",
        r.namespace, r.scanned
    );
    if n == 0 {
        println!("no corrupt items");
    } else {
        println!("{n} corrupt");
    }
    if r.unrecognised > 0 {
        println!(
            "  ({} item(s) of a layout tollgate does not know were not checked)",
            r.unrecognised
        );
    }
    for c in &r.corrupt {
        println!("{c}");
        println!("  {}", c.item);
        match r.repaired.iter().find(|x| x.corrupt.key == c.key) {
            Some(x) => println!("  repaired: {}", x.action),
            None => println!("  repair: {}", repair_hint(&c.item)),
        }
    }
}
