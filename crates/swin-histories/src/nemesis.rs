//! The nemesis: every 1–3 s one fault drawn from the run's list — `lost-reply` (a
//! node's relay loses the reply to its next reservation write or next request naming a
//! hot key, after the store applied it; half the time the node is then cut from the
//! store for 1.5–3 s, so that the change's outcome stays unknown past its answer), `kill` (SIGKILL a node, start it again on its
//! `data_dir`), `pause` (SIGSTOP the run's own Redis for 1–4 s), `cut` (a node's relay
//! refuses and cuts its store connections for 1–3 s), `reload` (SIGHUP a node, half the
//! time with a changed config: `side`'s limit, the sync period), `skew` (a node stopped
//! and started again with its wall clock 5–40 s ahead or behind, by libfaketime; the
//! next skew of it sets it right).

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::history::{Disruption, Event};
use crate::setup::{hot_keys, Cluster, StoreKind, Tuning, SIDE_LIMITS};

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    LostReply,
    Kill,
    Pause,
    Cut,
    Reload,
    Skew,
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Fault, String> {
        Ok(match s {
            "lost-reply" => Fault::LostReply,
            "kill" => Fault::Kill,
            "pause" => Fault::Pause,
            "cut" => Fault::Cut,
            "reload" => Fault::Reload,
            "skew" => Fault::Skew,
            other => {
                return Err(format!(
                    "unknown fault {other:?} (known: lost-reply, kill, pause, cut, reload, skew)"
                ))
            }
        })
    }
}

/// `--faults`: a comma list, empty for none.
pub fn parse_faults(list: &str) -> Result<Vec<Fault>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "none")
        .map(Fault::from_str)
        .collect()
}

/// Why `faults` cannot run on `store` in this version, if they cannot.
pub fn unsupported(faults: &[Fault], store: StoreKind) -> Option<String> {
    let relayed = faults
        .iter()
        .any(|f| matches!(f, Fault::LostReply | Fault::Cut));
    if relayed && matches!(store, StoreKind::Sqlite | StoreKind::RedisCluster) {
        return Some(
            "lost-reply and cut need a relay between a node and one server (redis, postgres)"
                .into(),
        );
    }
    if faults.contains(&Fault::Pause) && store != StoreKind::Redis {
        return Some("pause needs --store redis (a Redis server of the run's own)".into());
    }
    if faults.contains(&Fault::Skew) {
        if store == StoreKind::Sqlite {
            return Some(
                "skew: SQLite's nodes share one machine's clock (docs/operations.md, \"One clock\")"
                    .into(),
            );
        }
        if swin_testkit::cluster::libfaketime().is_none() {
            return Some("skew needs Debian's faketime (apt-get install faketime)".into());
        }
    }
    None
}

/// Arms node `i`'s relay to lose one reply: a reservation write or a hot key's request.
fn lose_reply(c: &Cluster, i: usize, rng: &mut StdRng, redis: bool) -> String {
    let relay = &c.relays[i];
    let ns = if rng.gen_bool(0.7) { "main" } else { "side" };
    let key = hot_keys(ns)[rng.gen_range(0..hot_keys(ns).len())];
    let what = rng.gen_range(0..4);
    let ops: [(&[u8], &[u8]); 3] = if redis {
        [
            (b"cost-reservation", b"\r\nopen\r\n"),
            (b"cost-reservation", b"\r\nextend\r\n"),
            (b"cost-reservation", b"\r\ntake\r\n"),
        ]
    } else {
        [
            (
                b"DELETE FROM swin_cost_reservations WHERE (namespace, id)",
                b"",
            ),
            (b"SET total = total +", b""),
            (b"SET ended =", b""),
        ]
    };
    let names = ["open", "extend", "take"];
    if what == 3 {
        relay.lose_reply_to(&[key.as_bytes()]);
        return format!("lost-reply node {i} next request naming {key}");
    }
    let (a, b) = ops[what];
    if redis {
        relay.lose_reply_to(&[a, b]);
    } else {
        relay.lose_reply_after(&[a], &[b"COMMIT"]);
    }
    format!("lost-reply node {i} next reservation {}", names[what])
}

/// A reply lost and then node `i` cut from the store for 1.5–3 s, longer than it waits
/// for an answer: the node answers 503 `outcome_unknown` and resolves the change in the
/// background (a lost reply alone is sent again and answered at once).
async fn lost_then_away(
    c: &Arc<Cluster>,
    i: usize,
    rng: &mut StdRng,
    redis: bool,
) -> (Option<usize>, Disruption, String) {
    let relay = &c.relays[i];
    let before = relay.lost();
    relay.cut_on_next_loss(true);
    let what = lose_reply(c, i, rng, redis);
    let give_up = Instant::now() + Duration::from_secs(4);
    while relay.lost() == before && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    relay.cut_on_next_loss(false);
    if relay.lost() == before {
        relay.disarm();
        return (
            Some(i),
            Disruption::Other,
            format!("{what} (none lost within 4 s)"),
        );
    }
    let ms = rng.gen_range(1500..3000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    relay.heal();
    (
        Some(i),
        Disruption::Away,
        format!("{what}, then cut from the store {ms} ms"),
    )
}

/// One fault, started and ended: what it did, to which node, and how the checks weigh it.
async fn strike(
    c: &Arc<Cluster>,
    fault: Fault,
    rng: &mut StdRng,
    redis: bool,
) -> (Option<usize>, Disruption, String) {
    let i = rng.gen_range(0..c.nodes.len());
    match fault {
        Fault::LostReply if rng.gen_bool(0.5) => lost_then_away(c, i, rng, redis).await,
        Fault::LostReply => (Some(i), Disruption::Other, lose_reply(c, i, rng, redis)),
        Fault::Kill => {
            c.kill(i);
            tokio::time::sleep(Duration::from_millis(rng.gen_range(200..1000))).await;
            let cc = c.clone();
            let _ = tokio::task::spawn_blocking(move || cc.restart(i)).await;
            c.ready(i).await;
            (
                Some(i),
                Disruption::Kill,
                format!("kill node {i}, started again"),
            )
        }
        Fault::Pause => {
            let ms = rng.gen_range(1000..4000);
            if let Some(server) = &c.redis {
                server.signal("STOP");
                tokio::time::sleep(Duration::from_millis(ms)).await;
                server.signal("CONT");
            }
            (None, Disruption::Away, format!("pause the store {ms} ms"))
        }
        Fault::Cut => {
            let ms = rng.gen_range(1000..3000);
            c.relays[i].cut();
            tokio::time::sleep(Duration::from_millis(ms)).await;
            c.relays[i].heal();
            (
                Some(i),
                Disruption::Away,
                format!("cut node {i} from the store {ms} ms"),
            )
        }
        Fault::Reload => {
            let mut what = format!("reload node {i}");
            if rng.gen_bool(0.5) {
                let t = Tuning {
                    side_limit: SIDE_LIMITS[rng.gen_range(0..SIDE_LIMITS.len())],
                    sync_rate: [0.2, 0.5][rng.gen_range(0..2)],
                };
                c.retune(i, t);
                what = format!(
                    "reload node {i} with side's limit {} and sync_rate {}",
                    t.side_limit, t.sync_rate
                );
            }
            c.signal(i, "HUP");
            (Some(i), Disruption::Other, what)
        }
        Fault::Skew => skew(c, i, rng).await,
    }
}

/// Node `i` stopped and started again with its clock off (or right again if it was off).
async fn skew(c: &Arc<Cluster>, i: usize, rng: &mut StdRng) -> (Option<usize>, Disruption, String) {
    let lib = swin_testkit::cluster::libfaketime().unwrap_or_default();
    let off = c.skewed(i);
    let (env, what) = if off {
        (Vec::new(), format!("skew node {i}: its clock right again"))
    } else {
        let secs = rng.gen_range(5..=40) * if rng.gen_bool(0.5) { 1 } else { -1 };
        let env = vec![
            ("LD_PRELOAD".to_owned(), lib),
            ("FAKETIME".to_owned(), format!("{secs:+}s")),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        ];
        (env, format!("skew node {i}: its clock {secs:+} s off"))
    };
    let cc = c.clone();
    let clean = tokio::task::spawn_blocking(move || cc.restart_in(i, env))
        .await
        .unwrap_or(false);
    c.ready(i).await;
    if clean {
        (Some(i), Disruption::Other, what)
    } else {
        (Some(i), Disruption::Kill, format!("{what}; {UNCLEAN}"))
    }
}

/// What an event says of a stop that did not exit 0 (a `clean-stop` violation).
pub const UNCLEAN: &str = "the stop exited non-zero";

/// Runs faults until `deadline`, each written to `log`.
pub async fn run(
    c: Arc<Cluster>,
    faults: Vec<Fault>,
    seed: u64,
    t0: Instant,
    deadline: Instant,
    log: Arc<Mutex<Vec<Event>>>,
) {
    if faults.is_empty() {
        return;
    }
    let watch = tokio::spawn(watch_losses(c.clone(), t0, log.clone()));
    let mut rng = StdRng::seed_from_u64(seed ^ 0x006e_656d_6573_6973);
    let redis = c.store.url.starts_with("redis");
    let faults: Vec<Fault> = faults
        .into_iter()
        .filter(|f| c.relays.len() == c.nodes.len() || !matches!(f, Fault::LostReply | Fault::Cut))
        .collect();
    if faults.is_empty() {
        watch.abort();
        return;
    }
    loop {
        let wait = Duration::from_millis(rng.gen_range(1000..3000));
        if Instant::now() + wait >= deadline {
            break;
        }
        tokio::time::sleep(wait).await;
        let fault = faults[rng.gen_range(0..faults.len())];
        let start_ms = t0.elapsed().as_millis() as u64;
        let (node, disruption, what) = strike(&c, fault, &mut rng, redis).await;
        let end_ms = t0.elapsed().as_millis() as u64;
        let event = Event {
            node,
            start_ms,
            end_ms,
            disruption,
            what,
        };
        log.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    }
    for relay in &c.relays {
        relay.disarm();
        relay.heal();
    }
    watch.abort();
}

/// Notes when each relay loses a reply (it is armed earlier; the loss comes with the
/// next request that matches), so that a violation can name the requests in flight.
async fn watch_losses(c: Arc<Cluster>, t0: Instant, log: Arc<Mutex<Vec<Event>>>) {
    let mut seen = vec![0; c.relays.len()];
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        for (i, relay) in c.relays.iter().enumerate() {
            let lost = relay.lost();
            if lost > seen[i] {
                seen[i] = lost;
                let at = t0.elapsed().as_millis() as u64;
                let event = Event {
                    node: Some(i),
                    start_ms: at.saturating_sub(20),
                    end_ms: at,
                    disruption: Disruption::ReplyLost,
                    what: format!("node {i}: a store reply lost"),
                };
                log.lock().unwrap_or_else(|p| p.into_inner()).push(event);
            }
        }
    }
}
