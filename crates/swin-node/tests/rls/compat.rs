//! Where envoyproxy/ratelimit's answers are the reference: each case is a behaviour of
//! its service (its config loader and `GetLimit`) that a file or a request written for it
//! relies on, asked of a real node.

use super::*;

/// A descriptor with no entries is OK with no limit (it was INVALID_ARGUMENT), unless it
/// carries its own `limit`, which then applies to every such descriptor together (one
/// counter, as envoyproxy/ratelimit's `domain.`); a rule without a `name` answers an
/// empty `current_limit.name` (it answered its path), a named one its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_descriptors_and_unnamed_rules() {
    let store = TestStore::sqlite().await;
    let mut run = start(&store, 0.1, "").await;
    let c = &mut run.grpc;
    let login = descriptor(&[("generic_key", "login"), ("remote_address", "9.9.9.9")]);
    let r = ask(c, "edge", vec![descriptor(&[]), login], 0)
        .await
        .expect("an answer, not INVALID_ARGUMENT");
    assert_eq!(codes(&r), vec![OK, OK]);
    assert!(r.statuses[0].current_limit.is_none(), "{r:?}");
    let unnamed = r.statuses[1].current_limit.as_ref().expect("a limit");
    assert_eq!(unnamed.name, "", "a rule without a name: an empty name");
    let r = ask(c, "edge", vec![descriptor(&[("vip", "dan")])], 0)
        .await
        .expect("answer");
    let named = r.statuses[0].current_limit.as_ref().expect("a limit");
    assert_eq!(named.name, "vip");
    // no entries and a limit of its own: one counter for all such descriptors
    let mut own = descriptor(&[]);
    own.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 2, // MINUTE
    });
    let first = ask(c, "edge", vec![own.clone()], 0).await.expect("first");
    let second = ask(c, "edge", vec![own], 0).await.expect("second");
    assert_eq!((codes(&first), codes(&second)), (vec![OK], vec![OVER]));
}

/// A `*` anywhere in a rule's value stands for any run of characters (it matched only at
/// the end): `bar*b` matches `barab` and `barb`, `foo*bar*baz` matches
/// `foo123bar456baz`; an exact value wins over a pattern, and of two patterns the first
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_anywhere_in_a_value() {
    let dir = tempfile::tempdir().expect("dir");
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(
        &yaml,
        "domain: edge
descriptors:
  - key: k
    value: bar*b
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: k
    value: foo*bar*baz
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: k
    value: foo*
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: k
    value: barab
    rate_limit: { unit: minute, requests_per_unit: 4 }
",
    )
    .expect("yaml");
    let config = format!(
        "[[namespaces]]\nname = \"edge\"\nsync_rate = -1\ndescriptors_file = \"{}\"\n",
        yaml.display()
    );
    let mut run = start_with(dir, &config).await;
    let c = &mut run.grpc;
    for (value, limit) in [
        ("bar123b", Some(1)),
        ("barb", Some(1)),
        ("barab", Some(4)),
        ("foo123bar456baz", Some(2)),
        ("foo123bar456", Some(3)),
        ("bar123", None),
        ("xbar1b", None),
    ] {
        let r = ask(c, "edge", vec![descriptor(&[("k", value)])], 0)
            .await
            .expect("answer");
        let got = r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit);
        assert_eq!(got, limit, "{value}");
    }
}

/// envoyproxy/ratelimit counts every hit, over the limit or not: 15 hits, then 10 more
/// (over a limit of 20), then 1 are OVER_LIMIT with 0 left twice. A namespace of rules
/// asks for that with `count_denied = true` (it was refused there); by default a request
/// over the limit counts nothing: OVER_LIMIT with 5 left, then OK with 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_denied_counts_as_envoyproxy_ratelimit_does() {
    let rule = "[[namespaces.descriptors]]\nkey = \"k\"\nrate_limit = { unit = \"hour\", requests_per_unit = 20 }\n";
    let config = format!(
        "[[namespaces]]\nname = \"go\"\nsync_rate = -1\ncount_denied = true\n{rule}\n\
         [[namespaces]]\nname = \"swin\"\nsync_rate = -1\n{rule}"
    );
    let dir = tempfile::tempdir().expect("dir");
    let mut run = start_with(dir, &config).await;
    let c = &mut run.grpc;
    for (domain, want) in [
        ("go", [(OK, 5), (OVER, 0), (OVER, 0)]),
        ("swin", [(OK, 5), (OVER, 5), (OK, 4)]),
    ] {
        let mut got = Vec::new();
        for hits in [15, 10, 1] {
            let r = ask(c, domain, vec![descriptor(&[("k", "a")])], hits)
                .await
                .expect("answer");
            got.push((r.overall_code, r.statuses[0].limit_remaining));
        }
        assert_eq!(got, want, "{domain}");
    }
}

/// envoyproxy/ratelimit adds no headers unless asked (`LIMIT_RESPONSE_HEADERS_ENABLED`);
/// swin adds `RateLimit-Policy` and `RateLimit` (and `Retry-After` when over) unless the
/// namespace says `envoy_response_headers = false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ratelimit_headers_can_be_switched_off() {
    let rule = "[[namespaces.descriptors]]\nkey = \"k\"\nrate_limit = { unit = \"hour\", requests_per_unit = 1 }\n";
    let config = format!(
        "[[namespaces]]\nname = \"quiet\"\nsync_rate = -1\nenvoy_response_headers = false\n{rule}\n\
         [[namespaces]]\nname = \"loud\"\nsync_rate = -1\n{rule}"
    );
    let dir = tempfile::tempdir().expect("dir");
    let mut run = start_with(dir, &config).await;
    let c = &mut run.grpc;
    for (domain, with_headers) in [("quiet", false), ("loud", true)] {
        for want in [OK, OVER] {
            let r = ask(c, domain, vec![descriptor(&[("k", "a")])], 0)
                .await
                .expect("answer");
            assert_eq!(r.overall_code, want, "{domain}");
            let names: Vec<&str> = r
                .response_headers_to_add
                .iter()
                .map(|h| h.key.as_str())
                .collect();
            assert_eq!(!names.is_empty(), with_headers, "{domain}: {names:?}");
            // dynamic metadata only with envoy_dynamic_metadata = true (the replay's)
            assert!(r.dynamic_metadata.is_none(), "{domain}: {r:?}");
            if with_headers {
                assert!(names.contains(&"RateLimit"), "{names:?}");
            }
        }
    }
}
