//! A fixed number of warm acquires on `MemoryStore`, for instruction-count profiles:
//! `valgrind --tool=callgrind target/release/examples/warm_acquire N LIMITS [ENTITIES]` twice (two N)
//! and divide the difference by the difference of N to get instructions per acquire,
//! independent of the machine's load.

use std::sync::Arc;

use tollgate::{Limit, Limiter, Scope};
use tollgate_store::MemoryStore;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10_000);
    let k: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1);
    let names = ["rpm", "tpm", "rpd"];
    let k = k.clamp(1, names.len());
    // Entities cycled over (the criterion bench in bench/ uses 10,000).
    let e: usize = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1)
        .max(1);
    let entities: Vec<String> = (0..e).map(|i| format!("user-{i}")).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let lim = Limiter::new(Arc::new(MemoryStore::new()))?;
    let limits = names[..k]
        .iter()
        .map(|x| Limit::per_second(x, 1_000_000_000))
        .collect::<Result<Vec<_>, _>>()?;
    let amounts: Vec<(&str, i64)> = names[..k].iter().map(|x| (*x, 1)).collect();
    rt.block_on(async {
        lim.admin()
            .set_limits(&Scope::Resource("api".into()), &limits)
            .await?;
        for _ in 0..2 {
            for id in &entities {
                lim.acquire(id, "api", &amounts).await?;
            }
        }
        for i in 0..n {
            let l = lim.acquire(&entities[i % e], "api", &amounts).await?;
            std::hint::black_box(l);
        }
        Ok::<_, tollgate::Error>(())
    })?;
    Ok(())
}
