//! A GCRA decision at a full table of 200,000 buckets, for a key the table holds and for
//! a new key (which must first make room), beside each other in the same run:
//! - `known`: a spend on a key the table holds;
//! - `new, evictable`: every bucket spent its whole burst and was drained (pushed), so a
//!   new key evicts the soonest to refill;
//! - `new, refused`: every bucket has advances not yet pushed, so a new key is refused.
//!
//! Prints the median nanoseconds per decision over 5 runs and each as a ratio to
//! `known`. Run: `cargo bench -p swin-core --bench full_buckets`

use std::hint::black_box;
use std::time::{Duration, Instant};

use swin_core::{BucketTable, Gcra, Retention};

const CAP: usize = 200_000;
const NOW: i64 = 1_763_784_000_000_000_000;
const OPS: usize = 200_000;
const RUNS: usize = 5;

fn full_table(g: &Gcra, drained: bool) -> BucketTable {
    let t = BucketTable::new("bench", CAP, Retention::Synced);
    for i in 0..CAP {
        t.spend(g, &format!("k{i}"), NOW + i as i64, g.burst(), false)
            .expect("room");
    }
    if drained {
        t.drain(NOW + CAP as i64);
    }
    t
}

fn per_op(f: impl FnOnce() -> usize) -> f64 {
    let start = Instant::now();
    let n = f();
    start.elapsed().as_nanos() as f64 / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let g = Gcra::new(10, 10, Duration::from_secs(3600)).expect("gcra");
    let now = NOW + CAP as i64 + 1;
    let (mut known, mut evict, mut refuse) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..RUNS {
        let t = full_table(&g, true);
        known.push(per_op(|| {
            for i in 0..OPS {
                black_box(t.spend(&g, &format!("k{}", i % CAP), now, 1, false).ok());
            }
            OPS
        }));
        evict.push(per_op(|| {
            for i in 0..OPS {
                let d = t.spend(&g, &format!("n{run}-{i}"), now, 1, false);
                assert!(d.is_ok(), "a new key gets room");
            }
            OPS
        }));
        let t = full_table(&g, false);
        refuse.push(per_op(|| {
            for i in 0..OPS {
                let d = t.spend(&g, &format!("n{run}-{i}"), now, 1, false);
                assert!(d.is_err(), "nothing may be evicted");
            }
            OPS
        }));
    }
    let k = median(known.clone());
    println!("full table of {CAP} buckets, medians of {RUNS} runs of {OPS} decisions");
    println!("| decision | ns | ratio to known | runs |");
    println!("|---|---|---|---|");
    for (name, v) in [
        ("known key", known),
        ("new key, evictable table", evict),
        ("new key, refused (all unpushed)", refuse),
    ] {
        let m = median(v.clone());
        let runs: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
        println!("| {name} | {m:.0} | {:.2} | {} |", m / k, runs.join(" "));
    }
}
