//! Rule "the rf lock pins the stamps" (`tollgate_core::writes::restates`): an rf-locked write
//! that leaves out what the item it is locked on already holds leaves the item exactly as
//! the write that restates everything — same condition outcome, same item after — through
//! drips, calendar resets, window opens, a parameter change, a TTL, fast-path debits in
//! between, and legacy items that lack `rc`.

use tollgate_core::bucket::{attr, BucketImage};
use tollgate_core::expr::Update;
use tollgate_core::materialize::{evaluate, evaluate_wcu, Evaluated};
use tollgate_core::value::{Item, Key, Value};
use tollgate_core::writes::{
    create_item, fast_write, next_rf, normal_write, params_hash, BucketIdentity, Charging,
    ItemStamp, TtlWrite,
};
use tollgate_core::Limit;
use tollgate_store::eval::{apply_update, eval_condition, key_item};

/// 2025-12-01T00:00:00Z less an hour: the walk crosses a daily edge.
const T0: i64 = 1_764_547_200_000 - 3_600_000;

fn limit_sets(capacity: i64) -> Vec<Vec<Limit>> {
    vec![
        vec![Limit::per_minute("rpm", capacity).expect("limit")],
        vec![
            Limit::per_second("rps", capacity).expect("limit"),
            Limit::quota_calendar("rpd", capacity * 100, "0 0 * * *", "UTC").expect("limit"),
        ],
        vec![
            Limit::per_minute("rpm", capacity).expect("limit"),
            Limit::quota_after("session", capacity, std::time::Duration::from_secs(1800))
                .expect("limit"),
        ],
    ]
}

/// What a write that restates everything would carry: the same evaluations, none of them
/// holding anything.
fn blind(evals: &[Evaluated]) -> Vec<Evaluated> {
    evals
        .iter()
        .cloned()
        .map(|mut e| {
            e.params_held = false;
            e.carry_read = None;
            e
        })
        .collect()
}

/// The two items hold the same attributes, but for a remainder `rc` that one leaves absent
/// (an item created without `b_wcu_rc`, a legacy one without a limit's) and the other
/// stamps 0: both read as 0.
fn same_item(a: &Item, b: &Item, what: &str) {
    for k in a.keys().chain(b.keys()) {
        let (x, y) = (a.get(k), b.get(k));
        let zero = Some(&Value::N(0));
        let unstamped_zero =
            k.ends_with("_rc") && (x.is_none() || y.is_none()) && (x == zero || y == zero);
        assert!(x == y || unstamped_zero, "{what}: {k}: {x:?} vs {y:?}");
    }
}

/// Shard 0 of (`e`, `api`) as a create at `T0` writes it for `limits`, with its key.
fn created(limits: &[Limit], ttl: TtlWrite) -> Item {
    let ph = params_hash(limits);
    let evals: Vec<Evaluated> = limits
        .iter()
        .map(|l| evaluate(l, None, T0, 1, T0, None))
        .collect();
    let stamp = ItemStamp {
        refilled_at_ms: next_rf(T0, None, &evals),
        valid_until_ms: None,
        ttl,
        params_hash: &ph,
        read: None,
    };
    let id = BucketIdentity {
        ns: "ns",
        entity: "e",
        resource: "api",
        shard: 0,
        shard_count: 1,
    };
    let mut item = create_item(&id, &stamp, limits, &evals, &[]);
    for (k, v) in key_item(&Key::new("ns/BUCKET#e#api#0", "#STATE")).iter() {
        item.insert(k.clone(), v.clone());
    }
    item
}

/// Every limit materialised from the image at `now`, as a pass plans them.
fn evaluated(limits: &[Limit], img: &BucketImage, now: i64) -> Vec<Evaluated> {
    limits
        .iter()
        .map(|l| {
            let st = img.limits.get(l.name());
            evaluate(l, st, img.refilled_at_ms, img.shard_count, now, None)
        })
        .collect()
}

fn actions(u: &Update) -> usize {
    let mut names = Vec::new();
    u.names(&mut names);
    names.len()
}

#[test]
fn a_write_that_leaves_out_what_the_item_holds_leaves_the_same_item() {
    let mut lcg: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |m: u64| {
        lcg = lcg
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (lcg >> 33) % m
    };
    let mut elided_total = 0;
    for set in 0..3 {
        for ttl in [TtlWrite::Remove, TtlWrite::Set(1_900_000_000)] {
            for legacy in [false, true] {
                let mut limits = limit_sets(50)[set].clone();
                let mut ph = params_hash(&limits);
                let mut item = created(&limits, ttl);
                let mut t = T0;
                for step in 0..400 {
                    // Mostly milliseconds apart (the warm case), now and then minutes (a
                    // drip refills, the window ends, the day turns).
                    t += if next(10) == 0 {
                        60_000 * (1 + next(30) as i64)
                    } else {
                        next(40) as i64
                    };
                    if step == 200 {
                        // A parameter change: a new hash, new `cp`/`ra` to stamp.
                        limits = limit_sets(80)[set].clone();
                        ph = params_hash(&limits);
                    }
                    if legacy {
                        // An item written before `rc` was stamped reads it as 0.
                        for l in &limits {
                            item.remove(&format!("b_{}_rc", l.name()));
                        }
                        item.remove("b_wcu_rc");
                    }
                    if next(3) == 0 {
                        // A fast-path debit in between (rf-less).
                        let amounts = vec![(limits[0].name().to_string(), 1000)];
                        let (u, c) = fast_write(&amounts, &limits, &ph, t);
                        if eval_condition(Some(&item), &c) {
                            item = apply_update(Some(&item), &item, &u).expect("fast debit");
                        }
                    }
                    let img = BucketImage::decode(&item).expect("decodes");
                    let evals = evaluated(&limits, &img, t);
                    let wcu = evaluate_wcu(img.wcu.as_ref(), img.refilled_at_ms, t);
                    let amounts: Vec<(String, i64)> = limits
                        .iter()
                        .map(|l| (l.name().to_string(), 1000 * next(3) as i64))
                        .collect();
                    let stamp = |read| ItemStamp {
                        refilled_at_ms: next_rf(t, Some(img.refilled_at_ms), &evals),
                        valid_until_ms: tollgate_core::materialize::valid_until(&limits, &evals, t),
                        ttl,
                        params_hash: &ph,
                        read,
                    };
                    let charging = Charging {
                        debt: true,
                        tc_only: &[],
                    };
                    let (ue, ce) = normal_write(
                        img.refilled_at_ms,
                        &stamp(Some(&img)),
                        &limits,
                        &evals,
                        &wcu,
                        &amounts,
                        charging,
                    );
                    let (uf, cf) = normal_write(
                        img.refilled_at_ms,
                        &stamp(None),
                        &limits,
                        &blind(&evals),
                        &blind(std::slice::from_ref(&wcu))[0],
                        &amounts,
                        charging,
                    );
                    assert_eq!(ce, cf, "the conditions are the same");
                    if !eval_condition(Some(&item), &ce) {
                        continue;
                    }
                    let after_e = apply_update(Some(&item), &item, &ue).expect("elided");
                    let after_f = apply_update(Some(&item), &item, &uf).expect("restated");
                    assert_eq!(
                        BucketImage::decode(&after_e).expect("decodes"),
                        BucketImage::decode(&after_f).expect("decodes"),
                        "set {set}, step {step}"
                    );
                    same_item(&after_e, &after_f, &format!("set {set}, step {step}"));
                    assert!(actions(&ue) <= actions(&uf));
                    elided_total += actions(&uf) - actions(&ue);
                    if !legacy && step > 0 && step != 200 {
                        // `ph` and every `cp` are held: never restated.
                        let mut names = Vec::new();
                        ue.names(&mut names);
                        assert!(
                            !names.iter().any(|n| n == attr::PH || n.ends_with("_cp")),
                            "set {set}, step {step}: {names:?}"
                        );
                    }
                    item = after_e;
                }
                assert_eq!(
                    item.get(attr::PH),
                    Some(&Value::S(ph.as_str().into())),
                    "the new hash was stamped"
                );
            }
        }
    }
    assert!(elided_total > 1000, "elided {elided_total} actions");
}

#[test]
fn an_item_without_the_stamp_gets_it() {
    // The image read holds no `ph` (or another one): the write stamps it.
    let limits = vec![Limit::per_minute("rpm", 10).expect("limit")];
    let ph = params_hash(&limits);
    let mut item = created(&limits, TtlWrite::Remove);
    item.insert(attr::PH.into(), Value::S("other".into()));
    let img = BucketImage::decode(&item).expect("decodes");
    let evals = evaluated(&limits, &img, T0 + 5);
    let wcu = evaluate_wcu(img.wcu.as_ref(), T0, T0 + 5);
    let stamp = ItemStamp {
        refilled_at_ms: T0 + 5,
        valid_until_ms: None,
        ttl: TtlWrite::Remove,
        params_hash: &ph,
        read: Some(&img),
    };
    let (u, _) = normal_write(T0, &stamp, &limits, &evals, &wcu, &[], Charging::default());
    let after = apply_update(Some(&item), &item, &u).expect("applies");
    assert_eq!(after.get(attr::PH), Some(&Value::S(ph.as_str().into())));
}
