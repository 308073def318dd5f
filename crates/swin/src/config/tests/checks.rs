//! Every error names its field: one test per kind of namespace and section, the cases
//! side by side.

use super::stores::Spec;
use super::*;

#[test]
fn errors_name_the_field() {
    fails(
        "[[namespaces]]\nname = \"a\"\nwindow_sizes = [0]\nsync_rate = -1",
        "namespaces[0].window_sizes",
    );
    fails(
        "[[namespaces]]\nname = \"a\"\nwindow_sizes = []\nsync_rate = -1",
        "namespaces[0].window_sizes",
    );
    fails(
        "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = 1",
        "namespaces[0].store",
    );
    fails(
        "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = 1\nstore = \"x\"",
        "namespaces[0].store",
    );
    fails("[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1\n[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1", "namespaces[1].name");
    fails("[stores.m]\nkind = \"mysql\"\nurl = \"x\"", "stores.m.kind");
    fails(
        "[stores.m]\nkind = \"redis\"\nurl = \"postgres://x\"",
        "stores.m.url",
    );
    // a setting of another store kind is an error, not silently ignored
    fails(
        "[stores.m]\nkind = \"postgres\"\nurl = \"postgres://x\"\nprefix = \"p\"",
        "stores.m.prefix",
    );
    fails(
        "[stores.m]\nkind = \"sqlite\"\nurl = \"sqlite::memory:\"\nmax_connections = 2",
        "stores.m.max_connections",
    );
    fails("", "namespaces");
    fails(
        "data_dir = \"\"\n[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1",
        "data_dir",
    );
    fails("bogus = 1", "(toml, line 1, column 1)");
    fails(
        "store_timeout = 1\nmigrate = maybe\n",
        "(toml, line 2, column 11)",
    );
    fails("store_timeout = 0", "store_timeout");
    fails("max_clock_offset = -1", "max_clock_offset");
    fails(
        "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1\n[quota]\nbuckets = 0",
        "quota.buckets",
    );
    // a value of the wrong type, at its line and column
    fails(
        "[[namespaces]]\nname = \"a\"\nwindow_sizes = \"60\"\nsync_rate = -1",
        "(toml, line 3, column 16)",
    );
}

#[test]
fn strict_admission_is_checked() {
    use super::{AdmissionMode, OnStoreFailure};
    let store = "[stores.m]\nkind = \"redis\"\nurl = \"redis://127.0.0.1\"\n";
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = 1\nstore = \"m\"\n";
    let limits = "limits = [{ window_size = 60, limit = 5 }]\n";
    let parse = |extra: &str| Config::parse("f.toml", &format!("{store}{ns}{extra}"), &no_env);
    let admission = |extra: &str| parse(extra).expect("valid").namespaces[0].admission;
    assert_eq!(admission(limits), AdmissionMode::Eventual);
    assert_eq!(
        admission(&format!("{limits}admission = \"strict\"")),
        AdmissionMode::Strict {
            on_store_failure: OnStoreFailure::Local
        }
    );
    assert_eq!(
        admission(&format!(
            "{limits}admission = \"strict\"\non_store_failure = \"deny\""
        )),
        AdmissionMode::Strict {
            on_store_failure: OnStoreFailure::Deny
        }
    );
    let fails_with = |extra: &str, field: &str| {
        let text = format!("{store}{ns}{extra}");
        fails(&text, field);
    };
    fails_with("admission = \"strict\"", "namespaces[0].admission");
    fails_with(
        &format!("{limits}admission = \"exact\""),
        "namespaces[0].admission",
    );
    fails_with(
        &format!("{limits}on_store_failure = \"deny\""),
        "namespaces[0].on_store_failure",
    );
    fails_with(
        &format!("{limits}admission = \"strict\"\non_store_failure = \"maybe\""),
        "namespaces[0].on_store_failure",
    );
    // GCRA buckets admit strictly too
    assert_eq!(
        admission("algorithm = \"gcra\"\ngcra = { burst = 5, count = 5, period = \"1m\" }\nadmission = \"strict\""),
        AdmissionMode::Strict {
            on_store_failure: OnStoreFailure::Local
        }
    );
    fails(
        &format!("[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = -1\n{limits}admission = \"strict\""),
        "namespaces[0].admission",
    );
}

#[test]
fn descriptor_rules_are_checked() {
    let ns = "[[namespaces]]\nname = \"edge\"\nsync_rate = -1\n";
    let rule = "[[namespaces.descriptors]]\nkey = \"k\"\nrate_limit = { unit = \"minute\", requests_per_unit = 5 }\n";
    let c = Config::parse("f.toml", &format!("{ns}{rule}"), &no_env).expect("valid");
    // a namespace of descriptor rules needs no window_sizes: every unit has a table
    let sizes: Vec<u32> = c.namespaces[0]
        .window_sizes
        .iter()
        .map(|s| s.secs())
        .collect();
    assert!(sizes.contains(&60) && sizes.contains(&86_400), "{sizes:?}");
    fails(
        &format!("{ns}[[namespaces.descriptors]]\nkey = \"k\"\nrate_limit = {{ unit = \"fortnight\", requests_per_unit = 5 }}\n"),
        "namespaces[0].descriptors",
    );
    fails(
        &format!("{ns}descriptors_file = \"/nonexistent/edge.yaml\"\n"),
        "namespaces[0].descriptors_file",
    );
}

#[test]
fn redis_cluster_stores_take_seed_urls() {
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = 1\nstore = \"c\"\n";
    let text = format!(
        "[stores.c]\nkind = \"redis_cluster\"\nurls = [\"redis://:pw@h1:7000\", \"redis://h2:7001\"]\n\
         prefix = \"p\"\nwait_replicas = 1\n{ns}"
    );
    let c = Config::parse("x", &text, &|_: &str| None).expect("valid");
    assert_eq!(
        c.stores["c"],
        StoreConfig(Spec::RedisCluster {
            urls: vec!["redis://:pw@h1:7000".into(), "redis://h2:7001".into()],
            prefix: "p".into(),
            access: Default::default(),
            wait_replicas: 1,
        })
    );
    assert_eq!(
        c.stores["c"].kind(),
        swin_sync::store::StoreKind::RedisCluster
    );
    let debug = format!("{c:?}");
    assert!(!debug.contains("pw"), "{debug}");
    // the seeds may come from the environment
    let env =
        |k: &str| (k == "SWIN_STORE_C_URLS").then(|| "redis://e1:1, redis://e2:2".to_string());
    let c = Config::parse("x", &text, &env).expect("valid");
    let Spec::RedisCluster { urls, .. } = &c.stores["c"].0 else {
        panic!("redis_cluster")
    };
    assert_eq!(urls, &["redis://e1:1", "redis://e2:2"]);
    // fingerprints tell clusters apart by every seed
    let other = StoreConfig(Spec::RedisCluster {
        urls: vec!["redis://:pw@h1:7000".into()],
        prefix: "p".into(),
        access: Default::default(),
        wait_replicas: 1,
    });
    assert_ne!(other.fingerprint(), c.stores["c"].fingerprint());
    for (store, field) in [
        (
            "kind = \"redis_cluster\"\nurl = \"redis://h\"",
            "stores.c.url",
        ),
        ("kind = \"redis_cluster\"", "stores.c.urls"),
        ("kind = \"redis_cluster\"\nurls = []", "stores.c.urls"),
        (
            "kind = \"redis_cluster\"\nurls = [\"postgres://h\"]",
            "stores.c.urls",
        ),
        (
            "kind = \"redis_cluster\"\nurls = [\"redis+unix:///s\"]",
            "stores.c.urls",
        ),
        (
            "kind = \"redis_cluster\"\nurls = [\"redis://a:1/2\"]",
            "stores.c.urls",
        ),
        (
            "kind = \"redis_cluster\"\nurls = [\"redis://a:x\"]",
            "stores.c.urls",
        ),
        (
            "kind = \"redis_cluster\"\nurls = [\"rediss://a\", \"redis://b\"]",
            "stores.c.urls",
        ),
        (
            "kind = \"redis_cluster\"\nurls = [\"redis://a\"]\nwait_replicas = 17",
            "stores.c.wait_replicas",
        ),
        (
            "kind = \"redis\"\nurl = \"redis://a\"\nwait_replicas = 1",
            "stores.c.wait_replicas",
        ),
        ("kind = \"redis\"\nurls = [\"redis://a\"]", "stores.c.urls"),
        ("kind = \"redis\"", "stores.c.url"),
    ] {
        fails(&format!("[stores.c]\n{store}\n{ns}"), field);
    }
}

#[test]
fn concurrency_namespaces_are_checked() {
    let ns = "[[namespaces]]\nname = \"a\"\nsync_rate = -1\n";
    let parse = |extra: &str| Config::parse("f.toml", &format!("{ns}{extra}"), &no_env);
    let c = parse("algorithm = \"concurrency\"\nlimit = 20\n")
        .expect("valid")
        .namespaces[0]
        .concurrency
        .expect("concurrency");
    assert_eq!(
        (c.limit, c.lease_ttl),
        (20, std::time::Duration::from_secs(30))
    );
    let c = parse("algorithm = \"concurrency\"\nlimit = 1\nlease_ttl = 0.5\n")
        .expect("valid")
        .namespaces[0]
        .concurrency
        .expect("concurrency");
    assert_eq!(c.lease_ttl, std::time::Duration::from_millis(500));
    let hits = parse("window_sizes = [60]\n").expect("valid");
    assert_eq!(hits.namespaces[0].concurrency, None);
    // the algorithm says it, one value for every reader
    use crate::policy::algorithm::Algorithm;
    let leases = parse("algorithm = \"concurrency\"\nlimit = 2\n").expect("valid");
    assert_eq!(leases.namespaces[0].algorithm, Algorithm::Concurrency);
    assert_eq!(hits.namespaces[0].algorithm, Algorithm::SlidingWindow);
    // limits of hits are never read in a concurrency namespace's shape (runtime limits)
    let raw: crate::policy::limits::RawKeyLimits =
        serde_json::from_str(r#"{"limits": [{"window_size": 60, "limit": 5}]}"#).expect("json");
    let sizes = [swin_core::WindowSize::new(60).expect("size")];
    let (field, why) = raw
        .validate(Algorithm::Concurrency, &sizes)
        .expect_err("no limits of hits");
    assert_eq!(field, "limits");
    assert!(why.contains("leases in flight"), "{why}");
    // descriptor rules of slots in flight, and no window tables for them
    let rules = parse("algorithm = \"concurrency\"\nlimit = 1\n[[namespaces.descriptors]]\nkey = \"user\"\nrate_limit = { requests_per_unit = 4 }\n")
        .expect("valid");
    let n = &rules.namespaces[0];
    let rule = n.rules.as_ref().expect("rules").find(&[("user", "u")]);
    assert_eq!(
        rule.map(|r| r.limit.clone()),
        Some(crate::policy::rules::RuleLimit::InFlight(4))
    );
    assert!(n.window_sizes.is_empty(), "{:?}", n.window_sizes);
    let c = "algorithm = \"concurrency\"\n";
    for (extra, field) in [
        (c.to_string(), "limit"),
        (format!("{c}limit = 0"), "limit"),
        (format!("{c}limit = -3"), "limit"),
        (format!("{c}limit = 1000000001"), "limit"),
        (format!("{c}limit = 5\nlease_ttl = 0"), "lease_ttl"),
        (format!("{c}limit = 5\nlease_ttl = -1"), "lease_ttl"),
        (format!("{c}limit = 5\nlease_ttl = 86401"), "lease_ttl"),
        (format!("{c}limit = 5\nlease_ttl = nan"), "lease_ttl"),
        (
            format!("{c}limit = 5\nlimits = [{{ window_size = 60, limit = 5 }}]"),
            "limits",
        ),
        (format!("{c}limit = 5\nadmission = \"strict\""), "admission"),
        (
            format!("{c}limit = 5\n[[namespaces.descriptors]]\nkey = \"u\"\nlimits = [{{ window_size = 60, limit = 5 }}]"),
            "descriptors",
        ),
        (
            format!("{c}limit = 5\nkey_from = \"client_address\""),
            "key_from",
        ),
        ("window_sizes = [60]\nlimit = 5".into(), "limit"),
        ("window_sizes = [60]\nlease_ttl = 5".into(), "lease_ttl"),
    ] {
        fails(&format!("{ns}{extra}\n"), &format!("namespaces[0].{field}"));
    }
}

#[test]
fn shadow_is_checked() {
    let store = "[stores.r]\nkind = \"redis\"\nurl = \"redis://h\"\n";
    let ns =
        "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60, 3600]\nsync_rate = 1\nstore = \"r\"\n";
    let parse = |extra: &str| Config::parse("f.toml", &format!("{store}{ns}{extra}"), &no_env);
    let c = parse("shadow = true\nlimits = [{ window_size = 60, limit = 5 }]\n").expect("valid");
    assert!(c.namespaces[0].limits.as_ref().expect("limits").shadow);
    let c = parse(
        "limits = [{ window_size = 60, limit = 5 }, { window_size = 3600, limit = 9, shadow = true }]\n",
    )
    .expect("valid");
    let limits = c.namespaces[0].limits.as_ref().expect("limits");
    assert!(!limits.shadow && limits.default.has_shadow());
    // a strict namespace goes in shadow whole, and then never with on_store_failure = "deny"
    parse("admission = \"strict\"\nshadow = true\nlimits = [{ window_size = 60, limit = 5 }]\n")
        .expect("valid");
    let strict = "admission = \"strict\"\n";
    for (extra, field) in [
        (
            format!("{strict}limits = [{{ window_size = 60, limit = 5, shadow = true }}]"),
            "limits",
        ),
        (
            format!("{strict}limits = [{{ window_size = 60, limit = 5 }}]\n[[namespaces.overrides]]\nkeys = [\"k\"]\nlimits = [{{ window_size = 60, limit = 9, shadow = true }}]"),
            "overrides (key \"k\")",
        ),
        (
            format!("{strict}on_store_failure = \"deny\"\nshadow = true\nlimits = [{{ window_size = 60, limit = 5 }}]"),
            "on_store_failure",
        ),
        ("shadow = true".into(), "limits"),
    ] {
        fails(&format!("{store}{ns}{extra}\n"), &format!("namespaces[0].{field}"));
    }
    fails(
        "[[namespaces]]\nname = \"a\"\nsync_rate = -1\nalgorithm = \"concurrency\"\nlimit = 5\nshadow = true\n",
        "namespaces[0].shadow",
    );
    // rules-only namespaces put every rule in shadow
    let c = parse("shadow = true\n[[namespaces.descriptors]]\nkey = \"user\"\nrate_limit = { unit = \"hour\", requests_per_unit = 3 }\n")
        .expect("valid");
    let rules = c.namespaces[0].rules.as_ref().expect("rules");
    assert!(rules.find(&[("user", "u")]).expect("rule").shadow);
}

/// `overrun`: "debt" by default, "cap" when said; anything else, a namespace without
/// limits or a concurrency namespace is an error naming it; the builder writes the
/// file's value.
#[test]
fn overrun_is_debt_or_cap_on_namespaces_of_limits() {
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = -1\n";
    let limited = format!("{ns}limits = [{{ window_size = 60, limit = 5 }}]\n");
    let overrun = |text: &str| {
        let c = Config::from_toml(text).expect("valid");
        c.namespaces()[0]
            .limits()
            .map(crate::policy::limits::Limits::overrun)
    };
    use crate::policy::limits::Overrun;
    assert_eq!(overrun(&limited), Some(Overrun::Debt));
    assert_eq!(
        overrun(&format!("{limited}overrun = \"cap\"\n")),
        Some(Overrun::Cap)
    );
    assert_eq!(
        overrun(&format!("{limited}overrun = \"debt\"\n")),
        Some(Overrun::Debt)
    );
    fails(
        &format!("{limited}overrun = \"forgive\"\n"),
        "namespaces[0].overrun",
    );
    fails(&format!("{ns}overrun = \"cap\"\n"), "namespaces[0].limits");
    fails(
        "[[namespaces]]\nname = \"a\"\nsync_rate = -1\nalgorithm = \"concurrency\"\nlimit = 2\noverrun = \"cap\"\n",
        "namespaces[0].overrun",
    );
    let built = Config::builder()
        .namespace(
            crate::config::NamespaceConfig::builder("a")
                .window_sizes([60])
                .sync_rate(-1.0)
                .limit(60, 5.0)
                .overrun(Overrun::Cap),
        )
        .build()
        .expect("valid");
    let file = Config::from_toml(&format!("{limited}overrun = \"cap\"\n")).expect("valid");
    assert_eq!(built, file);
}
