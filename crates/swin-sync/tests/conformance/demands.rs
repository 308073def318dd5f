//! Demands of Envoy's quota service: every node reads every node's live entry for a
//! bucket, a node's new entry replaces its last, lapsed entries no longer count, and the
//! demands round-trip exactly, signs and all (claims, proxies gone and clients are
//! numbers below zero).

use swin_core::UnixMs;
use swin_sync::store::Demands;
use swin_testkit::TestStore;

fn entry(bucket: &str, node: &str, demands: &[f64], expires_at: i64) -> Demands {
    Demands {
        bucket: bucket.into(),
        node: node.into(),
        demands: demands.to_vec(),
        expires_at: UnixMs(expires_at),
    }
}

fn sorted(mut d: Vec<Demands>) -> Vec<(String, String, Vec<f64>)> {
    d.sort_by(|a, b| (&a.bucket, &a.node).cmp(&(&b.bucket, &b.node)));
    d.into_iter()
        .map(|d| (d.bucket, d.node, d.demands))
        .collect()
}

pub async fn demands_are_shared_replaced_and_lapse(s: &TestStore) {
    let now = 1_800_000_000_000;
    let store = &s.store;
    let odd = "name\u{1f}api:{x}|y,z é";
    store
        .post_demands(
            "ns",
            &[
                entry(
                    "a",
                    "n1",
                    &[10.0, 0.5, -1.0, -281474976710656.0],
                    now + 3_000,
                ),
                entry(odd, "n1", &[], now + 3_000),
            ],
        )
        .await
        .expect("post n1");
    store
        .post_demands("ns", &[entry("a", "n2", &[200.0], now + 1_000)])
        .await
        .expect("post n2");
    // another namespace's entry for the same bucket is not this one's
    store
        .post_demands("other", &[entry("a", "n3", &[7.0], now + 3_000)])
        .await
        .expect("post other");
    let read = store
        .read_demands("ns", &["a", odd, "unknown"], UnixMs(now))
        .await
        .expect("read");
    assert_eq!(
        sorted(read),
        vec![
            (
                "a".into(),
                "n1".into(),
                vec![10.0, 0.5, -1.0, -281474976710656.0]
            ),
            ("a".into(), "n2".into(), vec![200.0]),
            (odd.into(), "n1".into(), vec![]),
        ]
    );
    // n1's new entry replaces its last
    store
        .post_demands("ns", &[entry("a", "n1", &[1e9], now + 3_000)])
        .await
        .expect("post n1 again");
    // past n2's lapse, only n1's counts
    let read = store
        .read_demands("ns", &["a"], UnixMs(now + 1_000))
        .await
        .expect("read later");
    assert_eq!(sorted(read), vec![("a".into(), "n1".into(), vec![1e9])]);
    // long past every lapse: nothing, and reading again still answers
    for _ in 0..2 {
        let read = store
            .read_demands("ns", &["a", odd], UnixMs(now + 120_000))
            .await
            .expect("read much later");
        assert!(read.is_empty(), "{read:?}");
    }
}
