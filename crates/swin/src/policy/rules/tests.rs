use super::*;

fn yaml(text: &str) -> Rules {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, text).expect("write");
    Rules::load("edge", &[], Some(&path), Algorithm::default()).expect("rules")
}

fn limit_of(rules: &Rules, entries: &[(&str, &str)]) -> Option<u32> {
    rules.find(entries).map(|r| r.requests_per_unit)
}

/// envoyproxy/ratelimit's README, "Example 1" and "Example 2": the documented
/// descriptors and the limits its documentation says they get.
#[test]
fn the_documented_examples_match_as_documented() {
    let r = yaml(
        "domain: edge\ndescriptors:\n  - key: to_number\n    value: \"2061234567\"\n    descriptors:\n      - key: from_number\n        rate_limit:\n          unit: day\n          requests_per_unit: 10\n  - key: from_number\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n",
    );
    assert_eq!(
        limit_of(
            &r,
            &[("to_number", "2061234567"), ("from_number", "2062222222")]
        ),
        Some(10)
    );
    assert_eq!(limit_of(&r, &[("from_number", "2062222222")]), Some(100));
    // a number without its own rule and a deeper request than the rules: no limit
    assert_eq!(
        limit_of(&r, &[("to_number", "2069999999"), ("from_number", "1")]),
        None
    );
    assert_eq!(limit_of(&r, &[("to_number", "2061234567")]), None);

    // a rule at a level without a value matches any value there
    let r = yaml(
        "domain: edge\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n    descriptors:\n      - key: key2\n        rate_limit:\n          unit: minute\n          requests_per_unit: 5\n",
    );
    assert_eq!(
        limit_of(&r, &[("key1", "value1"), ("key2", "anything")]),
        Some(5)
    );
    assert_eq!(limit_of(&r, &[("key1", "value1")]), Some(1));
    assert_eq!(limit_of(&r, &[("key1", "value2")]), None);
}

fn rules_of(domain: &str, text: &str) -> Rules {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, text).expect("write");
    Rules::load(domain, &[], Some(&path), Algorithm::default()).expect("rules")
}

/// envoyproxy/ratelimit's README examples 2, 3, 4 and 9, loaded as they are written
/// there, matched as the README says they match.
#[test]
fn envoyproxy_ratelimit_readme_examples() {
    let messaging = rules_of(
        "messaging",
        "domain: messaging\ndescriptors:\n  # Only allow 5 marketing messages a day\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit:\n          unit: day\n          requests_per_unit: 5\n\n  # Only allow 100 messages a day to any unique phone number\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n",
    );
    let m = [("message_type", "marketing"), ("to_number", "2061111111")];
    assert_eq!(limit_of(&messaging, &m), Some(5));
    assert_eq!(
        limit_of(&messaging, &[("to_number", "2061111111")]),
        Some(100)
    );
    assert_eq!(messaging.find(&m).expect("rule").unit, 4); // DAY

    let edge = rules_of(
        "edge_proxy_per_ip",
        "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n\n  # Black list IP\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n",
    );
    assert_eq!(limit_of(&edge, &[("remote_address", "50.0.0.1")]), Some(10));
    let blocked = edge.find(&[("remote_address", "50.0.0.5")]).expect("rule");
    assert_eq!(blocked.limit, RuleLimit::Blocked);

    let flat = rules_of(
        "example4",
        "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit:\n      requests_per_unit: 300\n      unit: second\n",
    );
    let two = [("key", "value"), ("subkey", "subvalue")];
    assert_eq!(
        limit_of(&flat, &two),
        None,
        "a deeper request does not match"
    );
    let nested = rules_of(
        "example4",
        "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        rate_limit:\n          requests_per_unit: 300\n          unit: second\n",
    );
    assert_eq!(limit_of(&nested, &two), Some(300));

    let wild = rules_of(
        "example9",
        "domain: example9\ndescriptors:\n  - key: key1\n    value: value*\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n",
    );
    assert_eq!(limit_of(&wild, &[("key1", "value_1")]), Some(20));
    assert_eq!(limit_of(&wild, &[("key1", "value_2")]), Some(20));
    assert_eq!(limit_of(&wild, &[("key1", "other")]), None);
}

#[test]
fn prefixes_unlimited_shadow_and_replaces() {
    let r = yaml(
        "domain: edge\ndescriptors:\n  - key: path\n    value: /api/*\n    rate_limit:\n      unit: minute\n      requests_per_unit: 7\n  - key: path\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n  - key: user\n    value: admin\n    rate_limit:\n      unlimited: true\n  - key: user\n    shadow_mode: true\n    rate_limit:\n      name: per_user\n      unit: hour\n      requests_per_unit: 3\n  - key: vip\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000\n      replaces:\n        - name: per_user\n",
    );
    assert_eq!(limit_of(&r, &[("path", "/api/orders")]), Some(7));
    assert_eq!(limit_of(&r, &[("path", "/other")]), Some(100));
    let admin = r.find(&[("user", "admin")]).expect("rule");
    assert_eq!(admin.limit, RuleLimit::Unlimited);
    let user = r.find(&[("user", "bob")]).expect("rule");
    assert!(user.shadow);
    assert_eq!(user.name.as_deref(), Some("per_user"));
    assert_eq!(
        r.find(&[("vip", "x")]).expect("rule").replaces,
        vec!["per_user"]
    );
}

#[test]
fn errors_name_the_file_the_rule_and_the_field() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("bad.yaml");
    let cases = [
        ("domain: other\ndescriptors: []\n", "domain"),
        ("domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", "descriptors[0].rate_limit.unit"),
        ("domain: edge\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit:\n          unit: second\n          requests_per_unit: 5000000000\n", "descriptors[0].descriptors[0].rate_limit.requests_per_unit"),
        ("domain: edge\ndescriptors:\n  - key: a\n  - key: a\n", "descriptors[1]"),
        ("domain: edge\ndescriptors:\n  - key: \"\"\n", "descriptors[0].key"),
        ("domain: edge\ndescriptors:\n  - key: a\n    colour: red\n", "colour"),
    ];
    for (text, field) in cases {
        std::fs::write(&path, text).expect("write");
        let e = Rules::load("edge", &[], Some(&path), Algorithm::default()).expect_err(text);
        assert!(e.starts_with(&path.display().to_string()), "{e}");
        assert!(e.contains(field), "{field} not in {e}");
    }
}

/// `*` anywhere in a pattern: any run of characters, none included; everything else
/// literal; the whole text matched.
#[test]
fn glob_match_takes_a_star_anywhere() {
    for (p, t, want) in [
        ("k_bar*b", "k_barab", true),
        ("k_bar*b", "k_bar123b", true),
        ("k_bar*b", "k_barb", true),
        ("k_bar*b", "k_barba", false),
        ("k_bar*b", "k_xbarab", false),
        ("k_foo*bar*baz", "k_foo123bar456baz", true),
        ("k_foo*bar*baz", "k_foobarbaz", true),
        ("k_foo*bar*baz", "k_foo123bar456ba", false),
        ("k_/api/*", "k_/api/v1/items", true),
        ("*", "", true),
        ("a**b", "ab", true),
        ("k_é*", "k_éa", true),
    ] {
        assert_eq!(glob_match(p, t), want, "{p} against {t}");
    }
    // a pattern that makes naive recursive backtracking exponential: one pass per `*`
    let text = "a".repeat(5_000);
    assert!(!glob_match("*a*a*a*a*a*a*b", &text));
    assert!(glob_match("*a*a*a*a*a*a*", &text));
}

/// What envoyproxy/ratelimit refuses to load is refused, naming the field: an unlimited
/// rule with a unit, an empty `replaces` entry, a rule that replaces itself.
#[test]
fn files_envoyproxy_ratelimit_refuses_are_refused() {
    let load = |text: &str| {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, text).expect("write");
        Rules::load("edge", &[], Some(&path), Algorithm::default())
    };
    let err = load("domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n")
        .expect_err("unlimited with a unit");
    assert!(err.contains("descriptors[0].rate_limit.unit"), "{err}");
    let err = load("domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n")
        .expect_err("an empty replaces entry");
    assert!(err.contains("replaces[0].name: must not be empty"), "{err}");
    let err = load("domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      name: me\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: me\n")
        .expect_err("replaces itself");
    assert!(err.contains("own name"), "{err}");
    let err = load("domain: edge\ndescriptors:\n  - key: a\n    value: plain\n    share_threshold: true\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n")
        .expect_err("share_threshold without a wildcard");
    assert!(err.contains("descriptors[0].share_threshold"), "{err}");
    // what it loads, swin loads: unlimited without a unit, replaces of another name
    load("domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n  - key: b\n    rate_limit:\n      name: b\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: a\n")
        .expect("loads");
}

/// `share_threshold`: the values a `*` matches count under the value as written, at the
/// level it is set, whether the rule sits there or deeper; without it each value counts
/// on its own; an exact value written beside the wildcard keeps its own counter.
#[test]
fn share_threshold_counts_every_matched_value_as_the_rule_writes_it() {
    let r = yaml(
        "domain: edge\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n  - key: files\n    value: files/own.txt\n    rate_limit:\n      unit: hour\n      requests_per_unit: 5\n  - key: path\n    value: /api/*\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n  - key: tenant\n    value: t-*\n    share_threshold: true\n    metadata:\n      plan: { tier: gold }\n    descriptors:\n      - key: user\n        rate_limit:\n          unit: minute\n          requests_per_unit: 3\n",
    );
    let counted = |entries: &[(&str, &str)]| -> Vec<(String, String)> {
        let f = r.lookup(entries).expect("a rule");
        f.counted(entries)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    let own = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
    assert_eq!(
        counted(&[("files", "files/a.pdf")]),
        own("files", "files/*")
    );
    assert_eq!(
        counted(&[("files", "files/b.csv")]),
        own("files", "files/*")
    );
    assert_eq!(
        counted(&[("files", "files/own.txt")]),
        own("files", "files/own.txt")
    );
    assert_eq!(counted(&[("path", "/api/v1")]), own("path", "/api/v1"));
    assert_eq!(
        counted(&[("tenant", "t-1"), ("user", "u")]),
        vec![
            ("tenant".to_owned(), "t-*".to_owned()),
            ("user".to_owned(), "u".to_owned())
        ]
    );
    let deep = r.lookup(&[("tenant", "t-2"), ("user", "v")]).expect("rule");
    assert_eq!(deep.rule.requests_per_unit, 3);
    // metadata belongs to the level it is written at, not to the rule below it
    assert!(deep.rule.metadata.is_none());
}

/// A rule's `metadata` is carried as written, from YAML or TOML.
#[test]
fn metadata_is_carried_as_written() {
    let r = yaml(
        "domain: edge\ndescriptors:\n  - key: service\n    value: s1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n    metadata:\n      service_with_quota:\n        name: \"service_1\"\n        tags: [a, 1, true]\n",
    );
    let m = r.find(&[("service", "s1")]).expect("rule").metadata.clone();
    let want: serde_json::Value =
        serde_json::json!({"service_with_quota": {"name": "service_1", "tags": ["a", 1, true]}});
    assert_eq!(
        serde_json::Value::Object((*m.expect("metadata")).clone()),
        want
    );
}

/// A concurrency namespace's rules: `requests_per_unit` is the slots in flight, a unit
/// may be left out (and is not read when given), 0 blocks, `unlimited` takes no slot;
/// limits of hits (`limits`, `gcra`), an unknown unit or more than the most slots are
/// refused, naming the field.
#[test]
fn concurrency_rules_limit_requests_in_flight() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("rules.yaml");
    let load = |text: &str| {
        std::fs::write(&path, text).expect("write");
        Rules::load_concurrency("edge", &[], Some(&path))
    };
    let r = load(
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      requests_per_unit: 3\n    descriptors:\n      - key: model\n        value: big\n        rate_limit:\n          unit: second\n          requests_per_unit: 1\n  - key: tenant\n    value: free\n    rate_limit:\n      requests_per_unit: 0\n  - key: tenant\n    rate_limit:\n      unlimited: true\n",
    )
    .expect("rules");
    let limit = |e: &[(&str, &str)]| r.find(e).map(|r| r.limit.clone());
    assert_eq!(limit(&[("user", "u1")]), Some(RuleLimit::InFlight(3)));
    assert_eq!(
        limit(&[("user", "u1"), ("model", "big")]),
        Some(RuleLimit::InFlight(1))
    );
    assert_eq!(limit(&[("tenant", "free")]), Some(RuleLimit::Blocked));
    assert_eq!(limit(&[("tenant", "paid")]), Some(RuleLimit::Unlimited));
    assert_eq!(limit(&[("other", "x")]), None);
    // no window is needed for them
    assert!(r.find(&[("user", "u1")]).expect("rule").unit == 0);

    for (text, field) in [
        (
            "  - key: a\n    limits:\n      - { window_size: 60, limit: 5 }\n",
            "descriptors[0].limits",
        ),
        (
            "  - key: a\n    gcra: { burst: 1, count: 1, period: 1s }\n",
            "descriptors[0].gcra",
        ),
        (
            "  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 5 }\n",
            "descriptors[0].rate_limit.unit",
        ),
        (
            "  - key: a\n    rate_limit: { requests_per_unit: 1000000001 }\n",
            "descriptors[0].rate_limit.requests_per_unit",
        ),
    ] {
        let e = load(&format!("domain: edge\ndescriptors:\n{text}")).expect_err(field);
        assert!(e.contains(field), "{e} should name {field}");
    }
}
