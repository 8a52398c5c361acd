//! Test helper for the crash test (`tests/crash.rs`): opens the store at the path given as
//! the first argument and debits `n` of the item `crash|#COUNTER` by 1 with the condition
//! `n >= 1`, forever. After each acknowledged debit it prints `debit` and flushes, so a
//! parent that kills it with SIGKILL knows every debit the store acknowledged.

use std::io::Write;
use std::process::ExitCode;

use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::Key;
use tollgate_sqlite::SqliteStore;
use tollgate_store::{Store, StoreError, UpdateRequest};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: tollgate-sqlite-crashwriter PATH");
        return ExitCode::from(2);
    };
    let rt = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&path)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crashwriter: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::open(path)?;
    let key = Key::new("crash", "#COUNTER");
    let mut out = std::io::stdout().lock();
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
                out.write_all(b"debit\n")?;
                out.flush()?;
            }
            Err(StoreError::ConditionFailed { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}
