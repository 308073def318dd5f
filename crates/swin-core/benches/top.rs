//! The heavy-hitters sketch (`swin_core::top`) against exact counts: one minute of hits
//! drawn from a Zipf distribution over many keys, as a limited namespace sees them. Prints
//! how many of the true top keys it finds, how far its counts are off (measured, and the
//! bound it states), and what an `add` costs. Run: `cargo bench -p swin-core --bench top`.

use std::collections::HashMap;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use swin_core::top::TopKeys;

/// Key `k` (1-based) drawn with probability ∝ 1 / k^s, by inverting the CDF over a table.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for k in 1..=n {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut impl Rng) -> usize {
        let u: f64 = rng.gen();
        self.cdf.partition_point(|&c| c < u)
    }
}

fn main() {
    println!("| keys | hits | Zipf s | top-10 found | top-100 found | largest error (measured) | stated bound | stated ÷ measured | ns per add |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (keys, hits, s) in [
        (100_000usize, 1_000_000usize, 1.1),
        (1_000_000, 1_000_000, 1.1),
        (1_000_000, 1_000_000, 0.8),
        (100_000, 1_000_000, 1.5),
    ] {
        let zipf = Zipf::new(keys, s);
        let mut rng = rand::rngs::StdRng::seed_from_u64(20261124);
        let drawn: Vec<String> = (0..hits)
            .map(|_| format!("k{}", zipf.sample(&mut rng)))
            .collect();
        let sketch = TopKeys::default();
        let now = 1_800_000_000;
        let started = Instant::now();
        for k in &drawn {
            sketch.add(k, 1.0, now);
        }
        let per_add = started.elapsed().as_nanos() as f64 / hits as f64;
        let mut exact: HashMap<&str, f64> = HashMap::new();
        for k in &drawn {
            *exact.entry(k.as_str()).or_default() += 1.0;
        }
        let mut truth: Vec<(&str, f64)> = exact.iter().map(|(k, v)| (*k, *v)).collect();
        truth.sort_by(|a, b| b.1.total_cmp(&a.1));
        let answer = sketch.top(100, now);
        let found = |n: usize| {
            let want: Vec<&str> = truth.iter().take(n).map(|t| t.0).collect();
            answer
                .keys
                .iter()
                .take(n)
                .filter(|h| want.contains(&h.key.as_str()))
                .count()
        };
        let measured = answer
            .keys
            .iter()
            .map(|h| (h.count - exact.get(h.key.as_str()).copied().unwrap_or(0.0)).abs())
            .fold(0.0, f64::max);
        for h in &answer.keys {
            let real = exact.get(h.key.as_str()).copied().unwrap_or(0.0);
            assert!((h.count - real).abs() <= h.error, "{h:?} against {real}");
        }
        println!(
            "| {keys} | {hits} | {s} | {}/10 | {}/100 | {measured:.0} | {:.0} | {:.1} | {per_add:.0} |",
            found(10),
            found(100),
            answer.bound,
            answer.bound / measured.max(1.0),
        );
    }
}
