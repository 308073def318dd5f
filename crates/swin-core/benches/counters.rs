//! Increments per second and bytes per counter, each beside a plain
//! `DashMap<Box<str>, AtomicU64>` baseline measured in the same run.
//!
//! Run: `cargo bench -p swin-core --bench counters`

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dashmap::DashMap;
use rand::{Rng, SeedableRng};
use swin_core::{CounterOptions, UnixMs, WindowSize, WindowTable};

const KEYS: usize = 1_000_000;
const NOW: UnixMs = UnixMs(1_763_784_030_000);

type Baseline = DashMap<Box<str>, AtomicU64>;

fn keys() -> Vec<String> {
    (0..KEYS)
        .map(|i| format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255))
        .collect()
}

fn order(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(0..KEYS as u32)).collect()
}

fn table() -> WindowTable {
    WindowTable::new(
        "bench",
        WindowSize::new(60).expect("valid"),
        CounterOptions {
            max_counters: 2 * KEYS,
            ..CounterOptions::default()
        },
    )
}

trait Target: Sync {
    fn hit(&self, key: &str);
}

impl Target for WindowTable {
    fn hit(&self, key: &str) {
        black_box(self.increment(key, 1.0, NOW).expect("finite value"));
    }
}

impl Target for Baseline {
    fn hit(&self, key: &str) {
        if let Some(c) = self.get(key) {
            c.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.entry(key.into())
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `iters` hits split over `threads` threads and returns the wall time.
fn run<'k, T: Target, F: Fn(u64) -> &'k str + Sync>(
    target: &T,
    threads: usize,
    iters: u64,
    key_of: &F,
) -> Duration {
    let per = iters / threads as u64;
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..per {
                        target.hit(key_of(i * threads as u64 + t as u64));
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

fn bench_hot_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_key");
    g.throughput(Throughput::Elements(1));
    let ours = table();
    let base = Baseline::default();
    let key_of = |_: u64| "203.0.113.7";
    for threads in [1usize, 2] {
        g.bench_with_input(BenchmarkId::new("swin", threads), &threads, |b, &t| {
            b.iter_custom(|iters| run(&ours, t, iters.max(t as u64), &key_of))
        });
        g.bench_with_input(
            BenchmarkId::new("dashmap_baseline", threads),
            &threads,
            |b, &t| b.iter_custom(|iters| run(&base, t, iters.max(t as u64), &key_of)),
        );
    }
    g.finish();
}

fn bench_uniform(c: &mut Criterion) {
    let keys = keys();
    let idx = order(1 << 22, 7);
    let key_of = |i: u64| keys[idx[(i as usize) & ((1 << 22) - 1)] as usize].as_str();
    let ours = table();
    let base = Baseline::default();
    for k in &keys {
        ours.hit(k);
        base.hit(k);
    }
    let mut g = c.benchmark_group("uniform_1m_keys");
    g.throughput(Throughput::Elements(1));
    for threads in [1usize, 2] {
        g.bench_with_input(BenchmarkId::new("swin", threads), &threads, |b, &t| {
            b.iter_custom(|iters| run(&ours, t, iters.max(t as u64), &key_of))
        });
        g.bench_with_input(
            BenchmarkId::new("dashmap_baseline", threads),
            &threads,
            |b, &t| b.iter_custom(|iters| run(&base, t, iters.max(t as u64), &key_of)),
        );
    }
    g.finish();
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Resident bytes per live key: 1 M keys, each hit in two windows (ours keeps both in
/// one entry; the baseline keeps one number per key).
fn report_memory() {
    let keys = keys();
    // the baseline first: memory it frees is reused by whatever comes next
    let before = rss_bytes();
    let base = Baseline::default();
    for k in &keys {
        base.hit(k);
    }
    let base_bytes = rss_bytes().saturating_sub(before);
    let before = rss_bytes();
    let ours = table();
    let prev = UnixMs(NOW.0 - 60_000);
    for k in &keys {
        ours.increment(k, 1.0, prev).expect("finite");
        ours.increment(k, 1.0, NOW).expect("finite");
    }
    let ours_bytes = rss_bytes().saturating_sub(before);
    let held = ours.len();
    eprintln!(
        "memory: swin {:.1} bytes per key ({:.1} per key and window, {} entries, two windows each); dashmap baseline {:.1} bytes per key (one number)",
        ours_bytes as f64 / held as f64,
        ours_bytes as f64 / (2 * held) as f64,
        held,
        base_bytes as f64 / KEYS as f64,
    );
    drop(ours);
    drop(base);
}

fn bench_memory(_c: &mut Criterion) {
    report_memory();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = bench_memory, bench_hot_key, bench_uniform }
criterion_main!(benches);
