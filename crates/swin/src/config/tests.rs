//! The config's tests: every shipped file parses, defaults, environment overrides,
//! and every error names its field.
//!
//! Over 500 lines on purpose: one test per config key and per error it can name; the
//! cases read best side by side.

use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn every_shipped_config_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("config dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).expect("read");
            Config::parse(&path.display().to_string(), &text, &no_env)
                .unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 4, "expected the shipped configs, found {n}");
}

#[test]
fn the_embedded_default_is_sqlite_on_7070() {
    let c = Config::parse("x", DEFAULT_CONFIG, &no_env).expect("valid");
    assert_eq!(c.listen.to_string(), "127.0.0.1:7070");
    assert_eq!(c.stores["main"].kind(), swin_sync::store::StoreKind::Sqlite);
    let ns = &c.namespaces[0];
    assert_eq!(ns.name, "default");
    assert_eq!(
        ns.window_sizes.iter().map(|s| s.secs()).collect::<Vec<_>>(),
        vec![1, 60, 3600]
    );
}

#[test]
fn defaults_fill_what_a_config_leaves_out() {
    let c = Config::parse(
        "x",
        "[stores.r]\nkind = \"redis\"\nurl = \"redis://h\"\n\
         [stores.p]\nkind = \"postgres\"\nurl = \"postgres://h/db\"\n\
         [[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1",
        &no_env,
    )
    .expect("valid");
    assert_eq!(c.listen.to_string(), defaults::LISTEN);
    assert_eq!(c.body_limit, defaults::BODY_LIMIT);
    assert!(
        c.trusted_proxies.is_empty(),
        "no proxy is trusted unless listed"
    );
    assert_eq!(c.connections.max_connections, 10_000);
    assert_eq!(c.connections.header_timeout, Duration::from_secs(10));
    assert_eq!(c.connections.idle_timeout, Duration::from_secs(60));
    assert_eq!(c.connections.body_timeout, Duration::from_secs(30));
    assert_eq!(c.max_batch, 1_000);
    assert_eq!(c.namespaces[0].max_counters, defaults::MAX_COUNTERS);
    assert_eq!(
        swin_core::CounterOptions::default().max_counters,
        defaults::MAX_COUNTERS,
        "the node and the core agree on the table size"
    );
    assert_eq!(
        c.stores["r"],
        StoreConfig::Redis {
            url: "redis://h".into(),
            prefix: defaults::REDIS_PREFIX.into(),
            access: Default::default(),
        }
    );
    assert_eq!(
        c.stores["p"],
        StoreConfig::Postgres {
            url: "postgres://h/db".into(),
            max_connections: defaults::POSTGRES_MAX_CONNECTIONS,
            access: Default::default(),
        }
    );
}

#[test]
fn store_fingerprints_stay_what_spools_hold() {
    // written by earlier versions into spool files: must never change
    let sqlite = StoreConfig::Sqlite {
        url: "sqlite://data/swin.db".into(),
    };
    let redis = StoreConfig::Redis {
        url: "redis://127.0.0.1:6379".into(),
        prefix: "swin".into(),
        access: Default::default(),
    };
    assert_eq!(
        sqlite.fingerprint(),
        fnv(&["sqlite", "sqlite://data/swin.db", "swin"])
    );
    assert_eq!(
        redis.fingerprint(),
        fnv(&["redis", "redis://127.0.0.1:6379", "swin"])
    );
    assert_ne!(sqlite.fingerprint(), redis.fingerprint());
}

/// FNV-1a of the parts, each ended by a 0 byte: the fingerprint as first written.
fn fnv(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.bytes().chain([0])) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[test]
fn passwords_come_from_the_environment_and_never_show() {
    let text = "[stores.r]\nkind = \"redis\"\nurl = \"rediss://alice@h:6380\"\npassword_env = \"R_PASS\"\nca_file = \"/etc/ca.pem\"\n\
                [stores.p]\nkind = \"postgres\"\nurl = \"postgres://bob@h/db?sslmode=verify-full\"\npassword_env = \"P_PASS\"\n\
                [[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = 1\nstore = \"r\"\n";
    let env = |k: &str| match k {
        "R_PASS" => Some("r-secret".to_string()),
        "P_PASS" => Some("p-secret".to_string()),
        _ => None,
    };
    let c = Config::parse("x", text, &env).expect("valid");
    let StoreConfig::Redis { access, .. } = &c.stores["r"] else {
        panic!("redis")
    };
    assert_eq!(access.password.as_deref(), Some("r-secret"));
    assert_eq!(
        access.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/ca.pem"))
    );
    let StoreConfig::Postgres { access, .. } = &c.stores["p"] else {
        panic!("postgres")
    };
    assert_eq!(access.password.as_deref(), Some("p-secret"));
    let debug = format!("{c:?}");
    assert!(!debug.contains("secret"), "{debug}");
    // a variable that is not set, or the options on a store that has no server, are named
    fails(text, "stores.p.password_env");
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = 1\nstore = \"s\"\n";
    let sqlite = format!(
        "[stores.s]\nkind = \"sqlite\"\nurl = \"sqlite::memory:\"\npassword_env = \"X\"\n{ns}"
    );
    fails(&sqlite, "stores.s.password_env");
    let sqlite = format!(
        "[stores.s]\nkind = \"sqlite\"\nurl = \"sqlite::memory:\"\nca_file = \"/ca\"\n{ns}"
    );
    fails(&sqlite, "stores.s.ca_file");
}

#[test]
fn environment_overrides_listen_and_store_urls() {
    let env = |k: &str| match k {
        "SWIN_LISTEN" => Some("0.0.0.0:9000".to_string()),
        "SWIN_STORE_MAIN_URL" => Some("sqlite::memory:".to_string()),
        _ => None,
    };
    let c = Config::parse("x", DEFAULT_CONFIG, &env).expect("valid");
    assert_eq!(c.listen.to_string(), "0.0.0.0:9000");
    assert_eq!(c.stores["main"].url(), "sqlite::memory:");
    // an override at fault is named
    let bad = |var: &'static str, value: &'static str| {
        move |k: &str| (k == var).then(|| value.to_string())
    };
    for (var, value, field) in [
        ("SWIN_LISTEN", "nowhere", "listen (from SWIN_LISTEN)"),
        (
            "SWIN_STORE_MAIN_URL",
            "mysql://x",
            "stores.main.url (from SWIN_STORE_MAIN_URL)",
        ),
        (
            "SWIN_LOG_FORMAT",
            "xml",
            "log_format (from SWIN_LOG_FORMAT)",
        ),
    ] {
        let e = Config::parse("x", DEFAULT_CONFIG, &bad(var, value)).expect_err("invalid");
        assert_eq!(e.field, field, "{e}");
    }
}

fn fails(text: &str, field: &str) {
    let e = Config::parse("f.toml", text, &no_env).expect_err("invalid");
    assert_eq!(e.field, field, "{e}");
    assert!(e.to_string().starts_with("f.toml: "), "{e}");
}

#[test]
fn passwords_never_reach_an_error() {
    assert_eq!(
        redact("postgres://app:s3cr@t@db:5432/swin?sslmode=require"),
        "postgres://app:***@db:5432/swin?sslmode=require"
    );
    assert_eq!(
        redact("redis://:pw@127.0.0.1:6379"),
        "redis://:***@127.0.0.1:6379"
    );
    assert_eq!(
        redact("redis://127.0.0.1:6379/0"),
        "redis://127.0.0.1:6379/0"
    );
    assert_eq!(redact("sqlite://data/swin.db"), "sqlite://data/swin.db");
    let e = Config::parse(
        "f.toml",
        "[stores.m]\nkind = \"redis\"\nurl = \"postgres://u:hunter2@h/db\"\n",
        &no_env,
    )
    .expect_err("wrong scheme");
    assert!(!e.to_string().contains("hunter2"), "{e}");
    let c = Config::parse(
        "f.toml",
        "[stores.m]\nkind = \"redis\"\nurl = \"redis://u:hunter2@h\"\n\
         [[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1",
        &no_env,
    )
    .expect("valid");
    let printed = format!("{c:?}");
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(printed.contains("redis://u:***@h"), "{printed}");
}

#[test]
fn auth_tokens_are_checked() {
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1\n";
    let hash = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    let token = |name: &str, sha: &str, scopes: &str| {
        format!("[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{sha}\"\nscopes = {scopes}\n")
    };
    let ok = format!("{ns}{}", token("app", hash, r#"["count", "metrics"]"#));
    let c = Config::parse("f.toml", &ok, &no_env).expect("valid");
    let auth = c.auth.expect("auth");
    assert_eq!(auth.tokens[0].name, "app");
    assert_eq!(auth.tokens[0].scopes, vec![Scope::Count, Scope::Metrics]);
    assert_eq!(auth.tokens[0].sha256[0], 0xba);
    assert!(Config::parse("f.toml", ns, &no_env)
        .expect("valid")
        .auth
        .is_none());
    fails(&format!("{ns}[auth]\ntokens = []\n"), "auth.tokens");
    fails(
        &format!("{ns}{}", token("app", "abc", r#"["count"]"#)),
        "auth.tokens[0].sha256",
    );
    fails(
        &format!(
            "{ns}{}",
            token("app", &hash.replace('a', "g"), r#"["count"]"#)
        ),
        "auth.tokens[0].sha256",
    );
    fails(
        &format!("{ns}{}", token("app", hash, r#"["write"]"#)),
        "auth.tokens[0].scopes",
    );
    fails(
        &format!("{ns}{}", token("app", hash, "[]")),
        "auth.tokens[0].scopes",
    );
    fails(
        &format!("{ns}{}", token("", hash, r#"["count"]"#)),
        "auth.tokens[0].name",
    );
    let other = hash.replace('b', "c");
    fails(
        &format!(
            "{ns}{}{}",
            token("app", hash, r#"["count"]"#),
            token("app", &other, r#"["count"]"#)
        ),
        "auth.tokens[1].name",
    );
    fails(
        &format!(
            "{ns}{}{}",
            token("app", hash, r#"["count"]"#),
            token("ops", hash, r#"["admin"]"#)
        ),
        "auth.tokens[1].sha256",
    );
}

#[test]
fn errors_name_the_field() {
    fails("listen = \"nope\"", "listen");
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
    fails("log_format = \"xml\"", "log_format");
    fails("header_timeout = 0", "header_timeout");
    fails("max_connections = 0", "max_connections");
    fails("max_batch = 0", "max_batch");
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1\n";
    fails(
        &format!("{ns}[tls]\ncert = \"\"\nkey = \"k.pem\"\n"),
        "tls.cert",
    );
    fails(
        &format!("{ns}[tls]\ncert = \"c.pem\"\nkey = \"\"\n"),
        "tls.key",
    );
    fails(
        "trusted_proxies = [\"10.0.0.0/8\", \"proxy.local\"]",
        "trusted_proxies[1]",
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
    fails("listen = \"127.0.0.1:1\"\n", "namespaces");
    fails(
        "data_dir = \"\"\n[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1",
        "data_dir",
    );
    fails("bogus = 1", "(toml, line 1, column 1)");
    fails(
        "listen = \"127.0.0.1:1\"\nmigrate = maybe\n",
        "(toml, line 2, column 11)",
    );
}

#[test]
fn strict_admission_is_checked() {
    use super::{Admission, OnStoreFailure};
    let store = "[stores.m]\nkind = \"redis\"\nurl = \"redis://127.0.0.1\"\n";
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = 1\nstore = \"m\"\n";
    let limits = "limits = [{ window_size = 60, limit = 5 }]\n";
    let parse = |extra: &str| Config::parse("f.toml", &format!("{store}{ns}{extra}"), &no_env);
    let admission = |extra: &str| parse(extra).expect("valid").namespaces[0].admission;
    assert_eq!(admission(limits), Admission::Eventual);
    assert_eq!(
        admission(&format!("{limits}admission = \"strict\"")),
        Admission::Strict {
            on_store_failure: OnStoreFailure::Local
        }
    );
    assert_eq!(
        admission(&format!(
            "{limits}admission = \"strict\"\non_store_failure = \"deny\""
        )),
        Admission::Strict {
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
        Admission::Strict {
            on_store_failure: OnStoreFailure::Local
        }
    );
    fails(
        &format!("[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = -1\n{limits}admission = \"strict\""),
        "namespaces[0].admission",
    );
}

#[test]
fn grpc_listen_and_descriptor_rules_are_checked() {
    let ns = "[[namespaces]]\nname = \"edge\"\nsync_rate = -1\n";
    let rule = "[[namespaces.descriptors]]\nkey = \"k\"\nrate_limit = { unit = \"minute\", requests_per_unit = 5 }\n";
    let c = Config::parse(
        "f.toml",
        &format!("grpc_listen = \"127.0.0.1:8081\"\n{ns}{rule}"),
        &no_env,
    )
    .expect("valid");
    assert_eq!(c.grpc_listen, Some("127.0.0.1:8081".parse().expect("addr")));
    // a namespace of descriptor rules needs no window_sizes: every unit has a table
    let sizes: Vec<u32> = c.namespaces[0]
        .window_sizes
        .iter()
        .map(|s| s.secs())
        .collect();
    assert!(sizes.contains(&60) && sizes.contains(&86_400), "{sizes:?}");
    assert!(Config::parse("f.toml", &format!("{ns}{rule}"), &no_env)
        .expect("valid")
        .grpc_listen
        .is_none());
    let env = |k: &str| (k == "SWIN_GRPC_LISTEN").then(|| "0.0.0.0:9".to_owned());
    let c = Config::parse("f.toml", &format!("{ns}{rule}"), &env).expect("valid");
    assert_eq!(c.grpc_listen, Some("0.0.0.0:9".parse().expect("addr")));
    fails(
        &format!("grpc_listen = \"nope\"\n{ns}{rule}"),
        "grpc_listen",
    );
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
        StoreConfig::RedisCluster {
            urls: vec!["redis://:pw@h1:7000".into(), "redis://h2:7001".into()],
            prefix: "p".into(),
            access: Default::default(),
            wait_replicas: 1,
        }
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
    let StoreConfig::RedisCluster { urls, .. } = &c.stores["c"] else {
        panic!("redis_cluster")
    };
    assert_eq!(urls, &["redis://e1:1", "redis://e2:2"]);
    // fingerprints tell clusters apart by every seed
    let other = StoreConfig::RedisCluster {
        urls: vec!["redis://:pw@h1:7000".into()],
        prefix: "p".into(),
        access: Default::default(),
        wait_replicas: 1,
    };
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

#[test]
fn telemetry_is_checked() {
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = -1\n";
    let parse = |t: &str| Config::parse("f.toml", &format!("{ns}{t}"), &no_env);
    assert_eq!(parse("").expect("valid").telemetry, None);
    let t = parse("[telemetry]\notlp_endpoint = \"http://collector:4317\"\n")
        .expect("valid")
        .telemetry
        .expect("telemetry");
    assert_eq!(
        (
            t.otlp_endpoint.as_str(),
            t.service_name.as_str(),
            t.sample_ratio
        ),
        ("http://collector:4317", "swin-node", 1.0)
    );
    let t = parse("[telemetry]\notlp_endpoint = \"https://c:4317\"\nservice_name = \"edge\"\nsample_ratio = 0.25\n")
        .expect("valid")
        .telemetry
        .expect("telemetry");
    assert_eq!((t.service_name.as_str(), t.sample_ratio), ("edge", 0.25));
    for (text, field) in [
        (
            "otlp_endpoint = \"collector:4317\"",
            "telemetry.otlp_endpoint",
        ),
        (
            "otlp_endpoint = \"ftp://c:4317\"",
            "telemetry.otlp_endpoint",
        ),
        ("otlp_endpoint = \"\"", "telemetry.otlp_endpoint"),
        ("sample_ratio = 0.5", "telemetry.otlp_endpoint"),
        (
            "otlp_endpoint = \"http://c:4317\"\nsample_ratio = 1.5",
            "telemetry.sample_ratio",
        ),
        (
            "otlp_endpoint = \"http://c:4317\"\nsample_ratio = -0.1",
            "telemetry.sample_ratio",
        ),
        (
            "otlp_endpoint = \"http://c:4317\"\nsample_ratio = nan",
            "telemetry.sample_ratio",
        ),
        (
            "otlp_endpoint = \"http://c:4317\"\nservice_name = \" \"",
            "telemetry.service_name",
        ),
    ] {
        fails(&format!("{ns}[telemetry]\n{text}\n"), field);
    }
}
