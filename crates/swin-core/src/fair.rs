//! Dividing one limit among several takers by what each asks for (Envoy's rate limit
//! quota service: each proxy enforces its share locally).
//!
//! [`divide`] is max-min fair (water filling): a taker asking less than an equal split
//! gets what it asks, and what it leaves is split among the others the same way. When
//! everyone together asks less than the limit, what is left over is spread evenly, so
//! that a taker whose demand grows has room before the next division; either way the
//! shares add up to the limit exactly. [`whole`] turns shares into whole units that add
//! up to the limit's whole part (largest remainders), so rounding never adds to it.

/// Max-min fair shares of `limit` for `demands` (each taker's ask, in the limit's
/// units), in the demands' order; they add up to `limit` (none when there is no taker).
/// A demand that is not a number of at least 0 counts as 0.
///
/// ```
/// let shares = swin_core::fair::divide(&[10.0, 50.0, 200.0], 120.0);
/// assert_eq!(shares, vec![10.0, 50.0, 60.0]);
/// ```
pub fn divide(demands: &[f64], limit: f64) -> Vec<f64> {
    let limit = if limit.is_finite() {
        limit.max(0.0)
    } else {
        0.0
    };
    let asked = |d: f64| if d.is_finite() { d.max(0.0) } else { 0.0 };
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|&a, &b| asked(demands[a]).total_cmp(&asked(demands[b])));
    let mut shares = vec![0.0; demands.len()];
    let mut left = limit;
    for (i, &at) in order.iter().enumerate() {
        let even = left / (order.len() - i) as f64;
        let share = asked(demands[at]).min(even);
        shares[at] = share;
        left -= share;
    }
    // everyone got what they asked: the rest is spread evenly
    if left > 0.0 && !shares.is_empty() {
        let extra = left / shares.len() as f64;
        shares.iter_mut().for_each(|s| *s += extra);
    }
    shares
}

/// `shares` as whole units adding up to `floor(total of shares)`: each share rounded
/// down, then the units left given one each to the largest remainders (ties: the
/// earlier share).
///
/// ```
/// assert_eq!(swin_core::fair::whole(&[33.4, 33.3, 33.3]), vec![34, 33, 33]);
/// ```
pub fn whole(shares: &[f64]) -> Vec<u64> {
    let clean = |s: f64| if s.is_finite() { s.max(0.0) } else { 0.0 };
    let total: f64 = shares.iter().map(|&s| clean(s)).sum();
    let mut units: Vec<u64> = shares.iter().map(|&s| clean(s).floor() as u64).collect();
    let given: u64 = units.iter().sum();
    // a hair of slack: shares of an even split add up to a hair under the limit
    let mut left = ((total + 1e-9).floor() as u64).saturating_sub(given);
    let mut by_remainder: Vec<usize> = (0..shares.len()).collect();
    by_remainder.sort_by(|&a, &b| {
        let r = |i: usize| clean(shares[i]) - clean(shares[i]).floor();
        r(b).total_cmp(&r(a)).then(a.cmp(&b))
    });
    for at in by_remainder {
        if left == 0 {
            break;
        }
        units[at] += 1;
        left -= 1;
    }
    units
}

/// [`whole`], but the units left after rounding down go to the largest remainders with
/// ties broken in turn: at `turn` t they go first to the shares from index t × (units
/// left) on, wrapping around, so that equal shares below one unit each get it at one
/// turn in so many, not always the earlier ones. Remainders closer than a millionth are
/// ties (an even split's shares differ by a hair).
///
/// ```
/// let shares = [0.25; 4];
/// assert_eq!(swin_core::fair::whole_turning(&shares, 0), vec![1, 0, 0, 0]);
/// assert_eq!(swin_core::fair::whole_turning(&shares, 1), vec![0, 1, 0, 0]);
/// assert_eq!(swin_core::fair::whole_turning(&shares, 5), vec![0, 1, 0, 0]);
/// ```
pub fn whole_turning(shares: &[f64], turn: u64) -> Vec<u64> {
    let clean = |s: f64| if s.is_finite() { s.max(0.0) } else { 0.0 };
    let total: f64 = shares.iter().map(|&s| clean(s)).sum();
    let mut units: Vec<u64> = shares.iter().map(|&s| clean(s).floor() as u64).collect();
    let given: u64 = units.iter().sum();
    let mut left = ((total + 1e-9).floor() as u64).saturating_sub(given);
    if shares.is_empty() || left == 0 {
        return units;
    }
    let n = shares.len() as u64;
    let first = (turn % n).wrapping_mul(left % n) % n;
    let remainder = |i: usize| {
        let s = clean(shares[i]);
        ((s - s.floor()) * 1e6).round() as u64
    };
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by_key(|&i| {
        let from_first = (i as u64 + n - first) % n;
        (std::cmp::Reverse(remainder(i)), from_first)
    });
    for at in order {
        if left == 0 {
            break;
        }
        units[at] += 1;
        left -= 1;
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn a_taker_asking_less_than_an_even_split_gets_what_it_asks() {
        assert!(close(
            &divide(&[10.0, 50.0, 200.0], 120.0),
            &[10.0, 50.0, 60.0]
        ));
        assert!(close(
            &divide(&[200.0, 10.0, 50.0], 120.0),
            &[60.0, 10.0, 50.0]
        ));
        assert!(close(&divide(&[100.0, 100.0], 120.0), &[60.0, 60.0]));
    }

    #[test]
    fn what_nobody_asks_for_is_spread_evenly() {
        assert!(close(&divide(&[10.0, 20.0], 120.0), &[55.0, 65.0]));
        assert!(close(&divide(&[0.0, 0.0, 0.0], 90.0), &[30.0, 30.0, 30.0]));
    }

    #[test]
    fn shares_add_up_to_the_limit_whatever_the_demands() {
        for demands in [
            vec![1.0, 1e9, 3.5, 0.0],
            vec![f64::NAN, -5.0, f64::INFINITY],
            vec![7.0],
        ] {
            let s = divide(&demands, 1000.0);
            assert!((s.iter().sum::<f64>() - 1000.0).abs() < 1e-6, "{s:?}");
            assert!(s.iter().all(|x| x.is_finite() && *x >= 0.0));
        }
        assert!(divide(&[], 10.0).is_empty());
        assert_eq!(divide(&[5.0], f64::NAN), vec![0.0]);
    }

    #[test]
    fn whole_units_never_add_to_the_total() {
        assert_eq!(whole(&[10.0, 50.0, 60.0]), vec![10, 50, 60]);
        assert_eq!(whole(&[0.5, 0.5]), vec![1, 0]);
        assert_eq!(whole(&[40.0 / 3.0; 3]), vec![14, 13, 13]);
        let s = divide(&[3.0, 1e6, 7.7, 12.2], 101.5);
        assert_eq!(whole(&s).iter().sum::<u64>(), 101);
        assert!(whole(&[]).is_empty());
    }

    #[test]
    fn units_below_one_each_go_round_the_shares_in_turn() {
        // 25 units among 64 equal shares: each turn 25 others, every share in its turn
        let shares = divide(&[120.0; 64], 25.0);
        let mut got = [0u64; 64];
        for turn in 0..64 {
            let units = whole_turning(&shares, turn);
            assert_eq!(units.iter().sum::<u64>(), 25);
            assert!(units.iter().all(|&u| u <= 1), "{units:?}");
            got.iter_mut().zip(&units).for_each(|(g, u)| *g += u);
        }
        assert!(got.iter().all(|&g| g == 25), "{got:?}");
        // the largest remainders still come first; whole shares stay whole
        assert_eq!(whole_turning(&[1.5, 2.0, 0.7], 3), vec![1, 2, 1]);
        assert_eq!(whole_turning(&[0.9, 0.1, 0.0], 1), vec![1, 0, 0]);
        assert!(whole_turning(&[], 7).is_empty());
        assert_eq!(whole_turning(&[0.4], u64::MAX), vec![0]);
    }
}
