//! Property tests: random acquire / adjust / rollback / clock sequences on one bucket.

mod common;

use common::*;
use proptest::prelude::*;
use tollgate::{Limit, Scope};

#[derive(Debug, Clone)]
enum Op {
    Acquire(i64),
    Adjust(i64),
    Rollback(i64),
    Advance(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0i64..40).prop_map(Op::Acquire),
        (0i64..40, -30i64..60).prop_map(|(a, d)| Op::Adjust(a * 1000 + d)),
        (0i64..40).prop_map(Op::Rollback),
        (0i64..20_000).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The store's `tc` equals the model's net consumption, and the balance never exceeds
    /// the capacity once a refill has run.
    #[test]
    fn tc_matches_net_consumption(ops in proptest::collection::vec(op(), 1..40), fast in any::<bool>()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut o = opts();
            o.speculative = fast;
            let h = harness_with(T0, o);
            h.lim.admin().set_limits(&Scope::Entity("e".into(), Some("api".into())), &[
                Limit::rate("tpm", 100, 50, std::time::Duration::from_secs(10)).unwrap(),
            ]).await.unwrap();
            let mut net: i64 = 0;
            let mut now = T0;
            for o in ops {
                match o {
                    Op::Acquire(a) => {
                        if let Ok(l) = h.lim.acquire("e", "api", &[("tpm", a)]).await {
                            net += a * 1000;
                            drop(l);
                        }
                    }
                    Op::Adjust(x) => {
                        let (a, d) = (x.div_euclid(1000), x.rem_euclid(1000) - 30);
                        if let Ok(mut l) = h.lim.acquire("e", "api", &[("tpm", a)]).await {
                            net += a * 1000;
                            if a + d < 0 {
                                // A lease never returns more than it consumed.
                                let refused = matches!(
                                    l.adjust("tpm", d),
                                    Err(tollgate::Error::InvalidAdjustment { .. })
                                );
                                prop_assert!(refused, "an over-refund was accepted");
                                l.commit().await.unwrap();
                            } else {
                                l.adjust("tpm", d).unwrap();
                                l.commit().await.unwrap();
                                net += d * 1000;
                            }
                        }
                    }
                    Op::Rollback(a) => {
                        if let Ok(mut l) = h.lim.acquire("e", "api", &[("tpm", a)]).await {
                            l.adjust("tpm", 7).unwrap();
                            l.rollback().await.unwrap();
                        }
                    }
                    Op::Advance(ms) => {
                        now += ms;
                        h.at(now);
                    }
                }
                if let Some(tc) = h.store.inner().raw_get(&h.key("e", "api", 0)).and_then(|i| i.get("b_tpm_tc").and_then(|v| v.as_n())) {
                    prop_assert_eq!(tc, net);
                }
                let a = h.lim.check_availability("e", "api", tollgate::Amounts::new()).await.unwrap();
                prop_assert!(a.limits[0].available <= 100, "available {} > capacity", a.limits[0].available);
            }
            Ok(())
        })?;
    }
}
