//! Test helper for the crash test (`tests/crash.rs`): opens the store at the path given as
//! the first argument and debits `n` of the item `crash|#COUNTER` by 1 with the condition
//! `n >= 1`, until the stock is gone. After each acknowledged debit it prints `debit` and
//! flushes, so a parent that kills it with SIGKILL knows every debit the store acknowledged.
//!
//! An optional second argument runs that many concurrent debiting tasks (default 1), so the
//! store's group commit batches several debits into one commit. It reads the change feed
//! once first, so its change rows are the kind a reading process writes.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::Key;
use tollgate_sqlite::SqliteStore;
use tollgate_store::{ChangeFeed, FeedCursor, Store, StoreError, UpdateRequest};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: tollgate-sqlite-crashwriter PATH [TASKS]");
        return ExitCode::from(2);
    };
    let tasks = match args.next().map(|t| t.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            eprintln!("TASKS must be a number of at least 1");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&path, tasks)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crashwriter: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(path: &str, tasks: usize) -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteStore::open(path)?);
    // Read the feed once, as a server's aggregator does: from then on the store holds its
    // changes and writes their rows without the new images (`feed::record`), which a kill
    // leaves for the next reader to rebuild.
    store.read_feed(&FeedCursor::start(), 1).await?;
    let handles: Vec<_> = (0..tasks)
        .map(|_| tokio::spawn(debit_until_empty(Arc::clone(&store))))
        .collect();
    for h in handles {
        h.await??;
    }
    Ok(())
}

async fn debit_until_empty(store: Arc<SqliteStore>) -> Result<(), StoreError> {
    let key = Key::new("crash", "#COUNTER");
    loop {
        let r = store
            .update(UpdateRequest {
                key: key.clone(),
                update: Update::new().add("n", -1),
                condition: Some(Condition::ge("n", 1)),
                returns: ReturnValues::None,
            })
            .await;
        match r {
            Ok(_) => {
                let mut out = std::io::stdout().lock();
                out.write_all(b"debit\n")
                    .and_then(|()| out.flush())
                    .map_err(|e| StoreError::Unavailable(format!("stdout: {e}")))?;
            }
            Err(StoreError::ConditionFailed { .. }) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}
