//! The config's tests: every shipped file parses, defaults, environment overrides,
//! passwords and tokens; each key's checks, and the field every error names, in
//! `checks`.

use super::*;

mod checks;

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
fn a_token_comes_from_the_environment_hashed() {
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1\n";
    let from_env = |var: &str| {
        format!(
            "{ns}[[auth.tokens]]\nname = \"app\"\ntoken_env = \"{var}\"\nscopes = [\"decide\"]\n"
        )
    };
    let token = "0123456789abcdef0123456789abcdef";
    let parse = |text: &str, value: &str| {
        let value = value.to_owned();
        Config::parse("f.toml", text, &move |k| {
            (k == "APP_TOKEN").then(|| value.clone())
        })
    };
    let hash_of = |text: &str, value: &str| {
        parse(text, value)
            .expect("valid")
            .auth
            .expect("auth")
            .tokens[0]
            .sha256
    };
    let want = crate::auth::hash_token(token.as_bytes());
    let got: String = hash_of(&from_env("APP_TOKEN"), token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(got, want, "the token's SHA-256, as a client's is checked");
    // a secret made from a file may end with a newline: not part of the token
    assert_eq!(
        hash_of(&from_env("APP_TOKEN"), &format!("{token}\n")),
        hash_of(&from_env("APP_TOKEN"), token)
    );
    let refused = |text: &str, value: &str, field: &str, says: &str| {
        let e = parse(text, value).expect_err("refused");
        assert_eq!(e.field, field, "{e}");
        assert!(e.to_string().contains(says), "{e}");
        assert!(
            !e.to_string().contains(value.trim()) || value.is_empty(),
            "{e}"
        );
    };
    // not set: the field and the variable named, so a container says why it stops
    refused(
        &from_env("OTHER_TOKEN"),
        token,
        "auth.tokens[0].token_env",
        "\"OTHER_TOKEN\" is not set",
    );
    // a placeholder left in an example secret
    refused(
        &from_env("APP_TOKEN"),
        "change-me",
        "auth.tokens[0].token_env",
        "at least 16",
    );
    refused(
        &from_env("APP_TOKEN"),
        "",
        "auth.tokens[0].token_env",
        "0 bytes",
    );
    let hash = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    refused(
        &format!("{ns}[[auth.tokens]]\nname = \"app\"\nsha256 = \"{hash}\"\ntoken_env = \"APP_TOKEN\"\nscopes = [\"decide\"]\n"),
        token,
        "auth.tokens[0].token_env",
        "not both",
    );
    refused(
        &format!("{ns}[[auth.tokens]]\nname = \"app\"\nscopes = [\"decide\"]\n"),
        token,
        "auth.tokens[0].sha256",
        "token_env",
    );
}
