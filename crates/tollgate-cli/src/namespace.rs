//! `tollgate namespace`: the namespace registry (spec-base-system.md §7.3) — register,
//! list, show, delete (soft), recover, purge. Every change writes an audit record in the
//! registry's log (`tollgate audit list --namespaces`).

use clap::Subcommand;
use tollgate::{Namespace, NamespaceStatus};

use crate::fail::Failure;
use crate::store::Access;
use crate::{print_json, StoreArgs};

#[derive(Debug, Subcommand)]
pub(crate) enum NamespaceCmd {
    /// Register namespaces by name (idempotent: a registered name prints its id). Use one
    /// with `-N NAME` on any command, or `serve -N NAME`.
    Register {
        /// Names (letters, digits and _ . - : @, starting with a letter or digit).
        #[arg(required = true)]
        names: Vec<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List the namespaces (read-only); with --all also the soft-deleted ones (orphans)
    /// and those being purged.
    List {
        /// Also soft-deleted and purging namespaces.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Show one active namespace (read-only; exit 1 if there is none of the name).
    Show {
        /// The name.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Soft-delete a namespace: its data stays, acquires in it are refused until it is
    /// recovered (by id). Prints the id.
    Delete {
        /// The name.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Recover a soft-deleted namespace by id (refused while its name is registered again).
    Recover {
        /// The namespace id (from `delete` or `list --all`).
        id: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete every item of a soft-deleted namespace, then its registry record
    /// (refused while it is active). On DynamoDB it scans the table.
    Purge {
        /// The namespace id.
        id: String,
        /// Confirm the purge (required).
        #[arg(short = 'y', long)]
        yes: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
}

fn line(n: &Namespace) -> String {
    let status = match n.status {
        NamespaceStatus::Active => "active",
        NamespaceStatus::Deleted => "deleted",
        NamespaceStatus::Purging => "purging",
    };
    format!("{}  id {}  {status}", n.name, n.id)
}

pub(crate) async fn run(cmd: NamespaceCmd, json: bool) -> Result<(), Failure> {
    match cmd {
        NamespaceCmd::Register { names, store } => {
            let limiter = store.registry_limiter(Access::Create).await?;
            let mut out = Vec::new();
            for n in &names {
                out.push(limiter.admin().register_namespace(n).await?);
            }
            if json {
                print_json(&serde_json::json!({ "namespaces": out }));
            } else {
                for n in &out {
                    println!("registered {}", line(n));
                }
            }
            Ok(())
        }
        NamespaceCmd::List { all, store } => {
            let limiter = store.registry_limiter(Access::ReadOnly).await?;
            let list: Vec<Namespace> = limiter
                .list_namespaces()
                .await?
                .into_iter()
                .filter(|n| all || n.status == NamespaceStatus::Active)
                .collect();
            if json {
                print_json(&serde_json::json!({ "namespaces": list }));
            } else if list.is_empty() {
                println!("no namespaces registered");
            } else {
                for n in &list {
                    println!("{}", line(n));
                }
            }
            Ok(())
        }
        NamespaceCmd::Show { name, store } => {
            let limiter = store.registry_limiter(Access::ReadOnly).await?;
            match limiter.get_namespace(&name).await? {
                Some(n) if json => print_json(&serde_json::to_value(&n).unwrap_or_default()),
                Some(n) => println!("{}", line(&n)),
                None => return Err(tollgate::Error::NamespaceNotFound(name).into()),
            }
            Ok(())
        }
        NamespaceCmd::Delete { name, store } => {
            let limiter = store.registry_limiter(Access::Existing).await?;
            let gone = limiter.admin().delete_namespace(&name).await?;
            if json {
                print_json(&serde_json::json!({ "name": name, "deleted": gone }));
            } else {
                match gone {
                    Some(n) => println!(
                        "deleted {} (soft: recover with `tollgate namespace recover {}`)",
                        line(&n),
                        n.id
                    ),
                    None => println!("no active namespace {name:?}: nothing deleted"),
                }
            }
            Ok(())
        }
        NamespaceCmd::Recover { id, store } => {
            let limiter = store.registry_limiter(Access::Existing).await?;
            let n = limiter.admin().recover_namespace(&id).await?;
            if json {
                print_json(&serde_json::to_value(&n).unwrap_or_default());
            } else {
                println!("recovered {}", line(&n));
            }
            Ok(())
        }
        NamespaceCmd::Purge { id, yes, store } => {
            if !yes {
                return Err(Failure::BadInput(format!(
                    "purging deletes every item of namespace {id}: pass --yes to confirm"
                )));
            }
            let limiter = store.registry_limiter(Access::Existing).await?;
            let n = limiter.admin().purge_namespace(&id).await?;
            if json {
                print_json(&serde_json::json!({ "namespace_id": id, "deleted_items": n }));
            } else {
                println!("purged namespace {id}: {n} item(s) deleted");
            }
            Ok(())
        }
    }
}
