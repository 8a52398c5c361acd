//! ns per warm acquire on MemoryStore, with 1 and 3 limits (criterion).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::{Limit, Limiter, Scope};
use tollgate_store::MemoryStore;

fn warm_acquire(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for n in [1usize, 3] {
        let lim = Limiter::new(Arc::new(MemoryStore::new())).expect("limiter");
        let names = ["rpm", "tpm", "rpd"];
        let limits: Vec<Limit> = names[..n]
            .iter()
            .map(|x| Limit::per_second(x, 1_000_000_000).expect("limit"))
            .collect();
        let amounts: Vec<(&str, i64)> = names[..n].iter().map(|x| (*x, 1)).collect();
        rt.block_on(async {
            lim.admin()
                .set_limits(&Scope::Resource("api".into()), &limits)
                .await
                .expect("set limits");
            lim.acquire("user-1", "api", &amounts)
                .await
                .expect("first acquire");
        });
        c.bench_function(&format!("warm_acquire_memory_{n}_limits"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    let l = lim
                        .acquire("user-1", "api", &amounts)
                        .await
                        .expect("admitted");
                    criterion::black_box(l);
                })
            })
        });
    }
}

criterion_group!(benches, warm_acquire);
criterion_main!(benches);
