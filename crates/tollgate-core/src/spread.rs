//! Rule "a debit belongs to the entity": how one amount is taken from the shards of an
//! entity when the shard it was aimed at cannot cover it alone.
//!
//! An entity's balance is the sum of its shards' balances. A request larger than what the
//! drawn shard holds is still admitted when the entity as a whole can pay: it is debited
//! from several shards in one transaction, all or none (no peer does this; the original
//! leaves such requests unadmittable). A lease's reported usage (debt allowed) is taken the
//! same way, and the part no shard's balance covers is levelled over the shards, so that no
//! shard keeps admitting while its siblings carry the entity's debt.

/// One shard's balance as the planner sees it: `None` when the shard cannot take part (it
/// does not exist yet, or does not carry the limit).
pub type ShardBalance = Option<i64>;

/// Per-shard takes (same indices as the balances) that sum to `amount`, or `None` when the
/// entity cannot pay and `debt` is not allowed.
///
/// - An acquire (`debt = false`) is admitted iff the entity's total balance — debt on any
///   shard included — covers the amount; it is then taken from the positive balances, the
///   `preferred` shard first and then the largest (ties to the lowest index). No shard is
///   driven below zero.
/// - A lease's usage (`debt = true`) is always taken: first from the positive balances in
///   the same order, then the remainder is spread as debt over every usable shard by water-
///   filling from the top (the highest balances are lowered first, to a common level), so the
///   shards' debt stays level and each shard becomes spendable again only when its siblings do.
pub fn plan_spread(
    balances: &[ShardBalance],
    preferred: usize,
    amount: i64,
    debt: bool,
) -> Option<Vec<i64>> {
    let mut takes = vec![0i64; balances.len()];
    if amount <= 0 {
        return Some(takes);
    }
    let usable: Vec<usize> = (0..balances.len())
        .filter(|i| balances[*i].is_some())
        .collect();
    let total: i64 = usable.iter().filter_map(|i| balances[*i]).sum();
    if !debt && total < amount {
        return None;
    }
    let mut order: Vec<usize> = usable.clone();
    order.sort_by(|a, b| {
        let key = |i: &usize| {
            (
                *i != preferred,
                std::cmp::Reverse(balances[*i].unwrap_or(0)),
                *i,
            )
        };
        key(a).cmp(&key(b))
    });
    let mut rest = amount;
    for i in &order {
        if rest == 0 {
            break;
        }
        let b = balances[*i].unwrap_or(0);
        let t = b.max(0).min(rest);
        takes[*i] += t;
        rest -= t;
    }
    if rest > 0 {
        // Only debt is left (a covered acquire takes all it needs from the positives).
        if !debt || usable.is_empty() {
            return None;
        }
        level_debt(balances, &usable, &mut takes, rest);
    }
    debug_assert_eq!(takes.iter().sum::<i64>(), amount);
    debug_assert!(
        debt || takes
            .iter()
            .zip(balances)
            .all(|(t, b)| *t == 0 || b.is_some_and(|b| b - t >= 0)),
        "an acquire drives no shard below zero"
    );
    Some(takes)
}

/// Water-fill `rest` of debt downward over the usable shards (their balances after `takes`):
/// lower the highest to the next one's level, and so on, then share what is left evenly
/// (one milli more on the lowest indices for the rounding).
fn level_debt(balances: &[ShardBalance], usable: &[usize], takes: &mut [i64], rest: i64) {
    let after = |i: usize, takes: &[i64]| balances[i].unwrap_or(0) - takes[i];
    let mut rest = rest;
    let mut by_level: Vec<usize> = usable.to_vec();
    by_level.sort_by_key(|i| (std::cmp::Reverse(after(*i, takes)), *i));
    let mut k = 1;
    while rest > 0 {
        // The top `k` shards sit at the same level; lower them to the next shard's level, or
        // as far as `rest` allows.
        let level = after(by_level[0], takes);
        let next = by_level.get(k).map(|i| after(*i, takes));
        let group = &by_level[..k];
        let room = match next {
            Some(n) if n < level => (level - n).saturating_mul(k as i64),
            Some(_) => {
                k += 1;
                continue;
            }
            None => i64::MAX,
        };
        let step = room.min(rest);
        let each = step / k as i64;
        let extra = step % k as i64;
        let mut sorted: Vec<usize> = group.to_vec();
        sorted.sort_unstable();
        for (j, i) in sorted.iter().enumerate() {
            takes[*i] += each + i64::from((j as i64) < extra);
        }
        rest -= step;
        if k < by_level.len() {
            k += 1;
        }
    }
}

/// Rule "a refund repays the entity's debt": credits (non-negative, summing to `amount`)
/// that return a refund to an entity in debt from the bottom up — the lowest balances are
/// raised first, to a common level, the rest shared evenly — so a refund never makes one
/// shard spendable while its siblings still carry the entity's debt.
pub fn plan_refund(balances: &[ShardBalance], amount: i64) -> Vec<i64> {
    let mut credits = vec![0i64; balances.len()];
    let usable: Vec<usize> = (0..balances.len())
        .filter(|i| balances[*i].is_some())
        .collect();
    if amount <= 0 || usable.is_empty() {
        return credits;
    }
    let after = |i: usize, c: &[i64]| balances[i].unwrap_or(0) + c[i];
    let mut by_level = usable;
    by_level.sort_by_key(|i| (balances[*i].unwrap_or(0), *i));
    let mut rest = amount;
    let mut k = 1;
    while rest > 0 {
        let level = after(by_level[0], &credits);
        let next = by_level.get(k).map(|i| after(*i, &credits));
        let room = match next {
            Some(n) if n > level => (n - level).saturating_mul(k as i64),
            Some(_) => {
                k += 1;
                continue;
            }
            None => i64::MAX,
        };
        let step = room.min(rest);
        let each = step / k as i64;
        let extra = step % k as i64;
        let mut group: Vec<usize> = by_level[..k].to_vec();
        group.sort_unstable();
        for (j, i) in group.iter().enumerate() {
            credits[*i] += each + i64::from((j as i64) < extra);
        }
        rest -= step;
        if k < by_level.len() {
            k += 1;
        }
    }
    debug_assert_eq!(credits.iter().sum::<i64>(), amount);
    credits
}

/// Rule "the largest request that fits now": what the entity can pay in one request — the
/// sum of its shards' balances (debt counted), never below zero.
pub fn entity_available(balances: &[ShardBalance]) -> i64 {
    balances.iter().flatten().sum::<i64>().max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 1,000 / 4-shard repro: 250 on each, a request for 300 takes 250 from the drawn
    /// shard and 50 from the next; 1,000 fits exactly; 1,001 does not.
    #[test]
    fn a_request_larger_than_one_share() {
        let b = [Some(250), Some(250), Some(250), Some(250)];
        assert_eq!(plan_spread(&b, 2, 300, false), Some(vec![50, 0, 250, 0]));
        assert_eq!(plan_spread(&b, 0, 1000, false), Some(vec![250; 4]));
        assert_eq!(plan_spread(&b, 0, 1001, false), None);
        // A shard that cannot take part counts for nothing.
        assert_eq!(plan_spread(&[Some(250), None], 0, 300, false), None);
    }

    /// Debt on one shard holds back its siblings: 10 on two shards, 5 + 5; a usage of 10
    /// reported on shard 0 takes 5 from each, and then nothing is left to admit.
    #[test]
    fn debt_belongs_to_the_entity() {
        let b = [Some(5), Some(5)];
        assert_eq!(plan_spread(&b, 0, 10, true), Some(vec![5, 5]));
        assert_eq!(plan_spread(&[Some(-5), Some(5)], 1, 1, false), None);
        assert_eq!(
            plan_spread(&[Some(-5), Some(5)], 1, 0, false),
            Some(vec![0, 0])
        );
    }

    /// The debt no balance covers is levelled from the top.
    #[test]
    fn debt_is_levelled() {
        // 3 and 1 are taken, then 6 more: levels 0,0 → -3,-3.
        assert_eq!(
            plan_spread(&[Some(3), Some(1)], 1, 10, true),
            Some(vec![6, 4])
        );
        // A shard already deeper in debt is left alone until the others reach it.
        assert_eq!(
            plan_spread(&[Some(-6), Some(0), Some(0)], 0, 8, true),
            Some(vec![0, 4, 4])
        );
        // Once level, the rest is shared (the rounding milli on the lowest indices).
        assert_eq!(
            plan_spread(&[Some(-6), Some(0), Some(0)], 0, 14, true),
            Some(vec![1, 7, 6])
        );
    }

    /// A refund to an entity in debt raises the lowest first.
    #[test]
    fn refunds_repay_the_debt_from_the_bottom() {
        assert_eq!(
            plan_refund(&[Some(-1451), Some(-737), Some(-713)], 2000),
            vec![1151, 437, 412]
        );
        let after: Vec<i64> = [-1451i64, -737, -713]
            .iter()
            .zip(plan_refund(&[Some(-1451), Some(-737), Some(-713)], 2000))
            .map(|(b, c)| b + c)
            .collect();
        assert!(after.iter().max().unwrap() - after.iter().min().unwrap() <= 1);
        assert_eq!(plan_refund(&[Some(0), None, Some(5)], 3), vec![3, 0, 0]);
    }

    #[test]
    fn available_is_the_sum() {
        assert_eq!(entity_available(&[Some(3), Some(-1), None]), 2);
        assert_eq!(entity_available(&[Some(-3)]), 0);
    }
}
