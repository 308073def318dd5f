//! Strict admission through the engine, on every store: three engines (three nodes)
//! share one key's limit under random schedules — round robin, skewed to one node,
//! bursts — at random sync rates, with lost replies and failed calls thrown in. What they
//! admit in all never passes the limit; once they stop (giving back what they hold) the
//! store's count is exactly what they admitted.
//!
//! One file past 500 lines: the window and bucket properties and the lifecycle cases
//! (dead holders, lapsed grants, forgotten keys) share the node harness and schedules
//! above, and each reads best beside the others it mirrors.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use swin_core::{CounterOptions, NamespaceCounters, WindowAlgorithm, WindowLimit, WindowSize};
use swin_sync::admission::{Grants, Holds};
use swin_sync::store::{Fault, FaultyStore};
use swin_sync::{now, NamespaceSync, PushId, QuotaKeeper, Store, SyncMode, WindowKey};
use swin_testkit::TestStore;
use tokio_util::sync::CancellationToken;

const WINDOW: u64 = 3600;

/// An engine and the strict quota it keeps: [`Holds`] (windows) or [`Grants`] (buckets).
struct Node<Q> {
    engine: Arc<NamespaceSync>,
    quota: Arc<Q>,
    faults: Arc<FaultyStore>,
    cancel: CancellationToken,
    run: tokio::task::JoinHandle<()>,
}

fn windows(store: &Store, rate: f64) -> Node<Holds> {
    node(store, rate, Holds::new)
}

fn buckets(store: &Store, rate: f64) -> Node<Grants> {
    node(store, rate, Grants::new)
}

fn node<Q: QuotaKeeper + 'static>(store: &Store, rate: f64, quota: fn(&PushId) -> Q) -> Node<Q> {
    let (faulty, faults) = common::faulty(store);
    let size = WindowSize::new(WINDOW).expect("size");
    let counters = Arc::new(NamespaceCounters::new(
        "strict",
        &[size],
        CounterOptions::default(),
    ));
    let push = PushId::from(swin_sync::new_node_id());
    let quota = Arc::new(quota(&push));
    let engine = Arc::new(
        NamespaceSync::new(
            counters,
            SyncMode::Periodic(Duration::from_secs_f64(rate)),
            Some(faulty),
            push,
            Duration::from_secs(5),
        )
        .with_quota(quota.clone()),
    );
    let cancel = CancellationToken::new();
    let run = tokio::spawn(engine.clone().run(cancel.clone()));
    Node {
        engine,
        quota,
        faults,
        cancel,
        run,
    }
}

#[derive(Debug, Clone, Copy)]
enum Schedule {
    RoundRobin,
    /// 90 % of the hits to the first node.
    Skewed,
    /// Hits in concurrent bursts of 20, spread at random.
    Bursts,
}

#[derive(Debug)]
struct Case {
    key: String,
    algorithm: WindowAlgorithm,
    limit: f64,
    hits: usize,
    schedule: Schedule,
    faults: bool,
}

/// The node the next hit goes to, as the schedule says; with `faults`, one call in twenty
/// of that node then fails (before the store, or after it with the reply lost).
fn next_node<Q>(
    nodes: &[Node<Q>],
    schedule: Schedule,
    sent: usize,
    faults: bool,
    rng: &mut StdRng,
) -> usize {
    let n = match schedule {
        Schedule::RoundRobin => sent % 3,
        Schedule::Skewed if rng.gen_bool(0.9) => 0,
        _ => rng.gen_range(0..3),
    };
    if faults && rng.gen_bool(0.05) {
        let f = if rng.gen_bool(0.5) {
            Fault::FailAfter
        } else {
            Fault::FailBefore
        };
        nodes[n].faults.plan([f]);
    }
    n
}

/// One case: `hits` hits of cost 1 on one key; returns (admitted, the store's count after
/// every node stopped), or None when the window changed during the case.
async fn case(store: &Store, c: &Case, rng: &mut StdRng) -> Option<(f64, f64)> {
    let Case {
        key,
        algorithm,
        limit,
        hits,
        schedule,
        faults,
    } = c;
    let (algorithm, limit, hits, schedule, faults) =
        (*algorithm, *limit, *hits, *schedule, *faults);
    let size = WindowSize::new(WINDOW).expect("size");
    let start = size.start_of(now());
    let rate = [0.01, 0.1, 1.0][rng.gen_range(0..3)];
    let nodes: Vec<Node<Holds>> = (0..3).map(|_| windows(store, rate)).collect();
    let l = WindowLimit::new(size, limit, algorithm).expect("limit");
    let mut admitted = 0.0;
    let burst = match schedule {
        Schedule::Bursts => 20,
        _ => 1,
    };
    let mut sent = 0;
    while sent < hits {
        let mut round = Vec::new();
        for _ in 0..burst.min(hits - sent) {
            let n = next_node(&nodes, schedule, sent, faults, rng);
            let (engine, quota) = (nodes[n].engine.clone(), nodes[n].quota.clone());
            let key = key.clone();
            round.push(tokio::spawn(async move {
                quota.admit(&engine, &key, &[l], 1.0, now()).await
            }));
            sent += 1;
        }
        for r in round {
            match r.await.expect("task") {
                Ok(v) if v[0].allowed => admitted += 1.0,
                // denied, or the store could not be asked (on_store_failure = "deny")
                Ok(_) | Err(_) => {}
            }
        }
        // a sync in between now and then
        if rng.gen_bool(0.1) {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(1..30))).await;
        }
    }
    // the store is healthy at shutdown: every node gives back what it did not use
    // (a store down then leaves that quota counted until the window ends, as a node
    // killed does)
    for n in &nodes {
        n.faults.clear_plan();
        n.cancel.cancel();
    }
    for n in nodes {
        n.run.await.expect("engine");
    }
    if size.start_of(now()) != start {
        return None;
    }
    let w = [WindowKey {
        key: key.as_str().into(),
        window_size: WINDOW as u32,
        window_start: start,
    }];
    let count = store
        .read("strict", &w)
        .await
        .expect("read")
        .first()
        .map_or(0.0, |t| t.count);
    Some((admitted, count))
}

async fn strict_admission_never_passes_the_limit(s: &TestStore) {
    let seed: u64 = std::env::var("SWIN_STRICT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let schedules = [Schedule::RoundRobin, Schedule::Skewed, Schedule::Bursts];
    let mut i = 0;
    while i < 6 {
        let algorithm = if rng.gen_bool(0.5) {
            WindowAlgorithm::Sliding
        } else {
            WindowAlgorithm::Fixed
        };
        let limit = f64::from(rng.gen_range(20u32..120));
        let schedule = schedules[i % 3];
        let faults = i >= 3;
        let key = format!("k{i}");
        let hits = (limit as usize) * 2;
        let c = Case {
            key,
            algorithm,
            limit,
            hits,
            schedule,
            faults,
        };
        let Some((admitted, count)) = case(&s.store, &c, &mut rng).await else {
            continue; // the hour turned during the case: run it again in the new one
        };
        let what = format!(
            "seed {seed} (SWIN_STRICT_SEED), case {i}: {algorithm:?} limit {limit}, {schedule:?}, faults {faults}"
        );
        assert!(admitted <= limit, "{what}: admitted {admitted}");
        assert_eq!(
            count, admitted,
            "{what}: the store counts what was admitted"
        );
        if !faults {
            assert!(admitted >= limit - 3.0, "{what}: admitted only {admitted}");
        }
        i += 1;
    }
}

/// A node that dies holding quota (it never gives it back) costs the others at most that
/// quota until the window ends, and never lets them admit more.
async fn a_dead_holder_costs_quota_not_correctness(s: &TestStore) {
    let size = WindowSize::new(WINDOW).expect("size");
    let l = WindowLimit::new(size, 100.0, WindowAlgorithm::Fixed).expect("limit");
    let dead = windows(&s.store, 0.1);
    for _ in 0..10 {
        dead.quota
            .admit(&dead.engine, "d", &[l], 1.0, now())
            .await
            .expect("admit");
    }
    let held_by_dead = 10.0
        + dead
            .quota
            .admit(&dead.engine, "d", &[l], 0.0, now())
            .await
            .expect("v")[0]
            .unused;
    dead.run.abort(); // killed: no give-back
    let live = windows(&s.store, 0.1);
    let mut admitted = 0.0;
    for _ in 0..200 {
        if live
            .quota
            .admit(&live.engine, "d", &[l], 1.0, now())
            .await
            .expect("admit")[0]
            .allowed
        {
            admitted += 1.0;
        }
    }
    assert_eq!(admitted, 100.0 - held_by_dead);
    live.cancel.cancel();
    live.run.await.expect("engine");
}

/// GCRA buckets: three engines spend one bucket under random schedules, sync rates,
/// lost replies and failed calls; the spends they admit, taken in time order, pass
/// Boulder's rule (each one: `max(tat, t) + ei − t ≤ burst·ei`), with 5 ms of slack
/// for the moment a spend is recorded here after the engine admitted it.
async fn strict_buckets_pass_boulders_rule(s: &TestStore) {
    let seed: u64 = std::env::var("SWIN_STRICT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let schedules = [Schedule::RoundRobin, Schedule::Skewed, Schedule::Bursts];
    for i in 0..6 {
        let burst = rng.gen_range(20i64..80);
        // one unit a second: a run of a second or two refills a unit or two
        let g = swin_core::Gcra::new(burst, 1, Duration::from_secs(1)).expect("gcra");
        let schedule = schedules[i % 3];
        let faults = i >= 3;
        let rate = [0.01, 0.1, 1.0][rng.gen_range(0..3)];
        let nodes: Vec<Node<Grants>> = (0..3).map(|_| buckets(&s.store, rate)).collect();
        let key = format!("b{i}");
        let started = std::time::Instant::now();
        let mut spends: Vec<i64> = Vec::new();
        let per_round = if matches!(schedule, Schedule::Bursts) {
            20
        } else {
            1
        };
        let hits = burst as usize * 2;
        let mut sent = 0;
        while sent < hits {
            let mut round = Vec::new();
            for _ in 0..per_round.min(hits - sent) {
                let n = next_node(&nodes, schedule, sent, faults, &mut rng);
                let (engine, quota) = (nodes[n].engine.clone(), nodes[n].quota.clone());
                let key = key.clone();
                round.push(tokio::spawn(async move {
                    let v = quota.admit(&engine, &g, &key, 1, now()).await;
                    (v, wall_ns())
                }));
                sent += 1;
            }
            for r in round {
                if let (Ok(v), at) = r.await.expect("task") {
                    if v.allowed {
                        spends.push(at);
                    }
                }
            }
            if rng.gen_bool(0.1) {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(1..30))).await;
            }
        }
        let took = started.elapsed();
        // units granted and not spent yet: held by their node until they lapse
        let held: i64 = nodes.iter().map(|n| n.quota.view(&key, now()).unused).sum();
        for n in &nodes {
            n.cancel.cancel();
        }
        for n in nodes {
            n.run.await.expect("engine");
        }
        let what = format!(
            "seed {seed} (SWIN_STRICT_SEED), case {i}: burst {burst}, {schedule:?}, faults {faults}, rate {rate}"
        );
        spends.sort_unstable();
        let (ei, slack) = (g.emission_ns(), 5_000_000);
        let mut tat = i64::MIN;
        for (n, &t) in spends.iter().enumerate() {
            let next = tat.max(t) + ei;
            assert!(
                next - t <= burst * ei + slack,
                "{what}: spend {n} of {} breaks the bucket",
                spends.len()
            );
            tat = next;
        }
        let admitted = spends.len() as i64;
        if !faults {
            // the burst, less a unit the horizon takes, a unit of rounding and the units
            // nodes still hold (a node grants blocks: a skewed schedule leaves some
            // with the nodes that see few hits); while no grant can have lapsed (the
            // case ran within one horizon), nothing else may be missing
            let refilled = took.as_secs() as i64;
            assert!(
                admitted <= burst + refilled + 1,
                "{what}: admitted {admitted} in {took:?}"
            );
            if took < swin_sync::horizon(&g) {
                assert!(
                    admitted + held >= burst - 2,
                    "{what}: admitted {admitted}, {held} held, in {took:?}"
                );
            }
        }
    }
}

/// A store that answers later than a grant's horizon: every grant lapses before it can
/// be spent, so after three the hit is refused (instead of asking until the bucket is
/// gone), and nothing lapsed is spent.
async fn grants_that_lapse_are_never_spent(s: &TestStore) {
    // burst 10 refilled in 200 ms: a horizon of 25 ms
    let g = swin_core::Gcra::new(10, 10, Duration::from_millis(200)).expect("gcra");
    assert_eq!(swin_sync::horizon(&g), Duration::from_millis(25));
    let n = buckets(&s.store, 1.0);
    n.faults.plan([Fault::Slow(Duration::from_millis(40)); 3]);
    let v = n
        .quota
        .admit(&n.engine, &g, "slow", 1, now())
        .await
        .expect("answered");
    assert!(!v.allowed, "{v:?}");
    assert_eq!(n.engine.reservations(), 3);
    // a store on time again: the hit passes
    let v = n
        .quota
        .admit(&n.engine, &g, "slow", 1, now())
        .await
        .expect("answered");
    assert!(v.allowed, "{v:?}");
    n.cancel.cancel();
    n.run.await.expect("engine");
}

/// A key's strict state is dropped once nothing is left to do with it — never while its
/// window lasts (its total in the store would then read as unused quota), and a bucket's
/// new grant request after its slot went never reuses an old number (the store would
/// answer it with the old grant, spent or lapsed).
async fn finished_keys_are_forgotten_and_come_back_exact(s: &TestStore) {
    // a window of an hour, limit 5: 3 admitted, then idle until the unused quota goes back;
    // the hour must not end while the test waits (the window's key would then go too)
    let into_hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        % 3600;
    if into_hour > 3600 - 60 {
        tokio::time::sleep(Duration::from_secs(3600 - into_hour + 1)).await;
    }
    let w = windows(&s.store, 1.0);
    let b = buckets(&s.store, 1.0);
    let hour = WindowSize::new(3600).expect("size");
    let l = WindowLimit::new(hour, 5.0, WindowAlgorithm::Fixed).expect("limit");
    let admit = || async {
        w.quota
            .admit(&w.engine, "w", &[l], 1.0, now())
            .await
            .expect("admit")[0]
            .allowed
    };
    for _ in 0..3 {
        assert!(admit().await);
    }
    // a bucket whose grants last 100 ms
    let g = swin_core::Gcra::new(100, 100, Duration::from_millis(800)).expect("gcra");
    let spend = || async {
        b.quota
            .admit(&b.engine, &g, "b", 1, now())
            .await
            .expect("admit")
            .allowed
    };
    assert!(spend().await);
    assert_eq!((w.engine.tracked_keys(), b.engine.tracked_keys()), (1, 1));
    let tat = || async {
        let t = s
            .store
            .read_tats("strict", &["b".into()])
            .await
            .expect("tats");
        t.first().map(|t| t.tat_ns)
    };
    let before = tat().await;
    tokio::time::sleep(Duration::from_millis(swin_sync::IDLE_MS as u64 + 800)).await;
    assert_eq!(
        (w.engine.tracked_keys(), b.engine.tracked_keys()),
        (1, 0),
        "the bucket went, the window's key stays"
    );
    // the window's key was kept: exactly 2 more pass
    let mut more = 0;
    for _ in 0..4 {
        if admit().await {
            more += 1;
        }
    }
    assert_eq!(more, 2);
    // the bucket's new slot is granted anew: the TAT moves
    assert!(spend().await);
    assert!(
        tat().await > before,
        "a new grant, not an old one answered again"
    );
    for n in [w.cancel, b.cancel] {
        n.cancel();
    }
    w.run.await.expect("engine");
    b.run.await.expect("engine");
}

/// A window's key is forgotten once its window is over and everything it did not use has
/// gone back; the store keeps exactly what was admitted (where it keeps the window: a
/// Redis hash expires three windows after it opened).
async fn ended_windows_are_forgotten(s: &TestStore) {
    let n = windows(&s.store, 1.0);
    let second = WindowSize::new(1).expect("size");
    let l = WindowLimit::new(second, 1000.0, WindowAlgorithm::Fixed).expect("limit");
    let start = second.start_of(now());
    let mut admitted = 0.0;
    while second.start_of(now()) == start {
        if n.quota
            .admit(&n.engine, "e", &[l], 1.0, now())
            .await
            .expect("admit")[0]
            .allowed
        {
            admitted += 1.0;
        }
        if admitted >= 5.0 {
            break;
        }
    }
    assert_eq!(n.engine.tracked_keys(), 1);
    tokio::time::sleep(Duration::from_millis(swin_sync::IDLE_MS as u64 + 800)).await;
    assert_eq!(n.engine.tracked_keys(), 0);
    let w = [WindowKey {
        key: "e".into(),
        window_size: 1,
        window_start: start,
    }];
    let count = s.store.read("strict", &w).await.expect("read");
    let count = count.first().map(|t| t.count);
    if s.store.capabilities().expires_by_itself {
        // a hash lives three windows (3 s here): gone, or exactly what was admitted
        assert!(count.is_none() || count == Some(admitted), "{count:?}");
    } else {
        assert_eq!(count, Some(admitted));
    }
    n.cancel.cancel();
    n.run.await.expect("engine");
}

fn wall_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64
}

swin_testkit::for_stores!([postgres, redis, redis_cluster, sqlite, valkey, redis8] [
    finished_keys_are_forgotten_and_come_back_exact,
    ended_windows_are_forgotten,
    grants_that_lapse_are_never_spent,
    strict_buckets_pass_boulders_rule,
    strict_admission_never_passes_the_limit,
    a_dead_holder_costs_quota_not_correctness
]);
