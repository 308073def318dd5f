//! The config's tests: defaults, environment overrides and passwords; each key's
//! checks, and the field every error names, in `checks`; a config built in code against
//! the same in TOML, in `builder`.

use super::stores::redact;
use super::stores::Spec;
use super::*;

mod builder;
mod checks;

fn no_env(_: &str) -> Option<String> {
    None
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
    assert!(c.migrate);
    assert_eq!(c.shutdown_grace, Duration::from_secs(10));
    assert_eq!(c.store_timeout, Duration::from_secs(5));
    assert_eq!(c.answer_timeout, Duration::from_millis(500));
    assert_eq!(c.max_clock_offset, Duration::from_secs(1));
    assert_eq!(c.data_dir, Path::new(defaults::DATA_DIR));
    assert_eq!(c.quota, crate::config::QuotaLimits::default());
    assert_eq!(c.namespaces[0].max_counters, defaults::MAX_COUNTERS);
    assert_eq!(
        swin_core::CounterOptions::default().max_counters,
        defaults::MAX_COUNTERS,
        "the node and the core agree on the table size"
    );
    assert_eq!(
        c.stores["r"],
        StoreConfig(Spec::Redis {
            url: "redis://h".into(),
            prefix: defaults::REDIS_PREFIX.into(),
            access: Default::default(),
        })
    );
    assert_eq!(
        c.stores["p"],
        StoreConfig(Spec::Postgres {
            url: "postgres://h/db".into(),
            max_connections: defaults::POSTGRES_MAX_CONNECTIONS,
            access: Default::default(),
        })
    );
}

#[test]
fn store_fingerprints_stay_what_spools_hold() {
    // written by earlier versions into spool files: must never change
    let sqlite = StoreConfig(Spec::Sqlite {
        url: "sqlite://data/swin.db".into(),
    });
    let redis = StoreConfig(Spec::Redis {
        url: "redis://127.0.0.1:6379".into(),
        prefix: "swin".into(),
        access: Default::default(),
    });
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
    let Spec::Redis { access, .. } = &c.stores["r"].0 else {
        panic!("redis")
    };
    assert_eq!(access.password.as_deref(), Some("r-secret"));
    assert_eq!(
        access.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/ca.pem"))
    );
    let Spec::Postgres { access, .. } = &c.stores["p"].0 else {
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
fn environment_overrides_store_urls_data_dir_and_migrate() {
    let text = "[stores.main]\nkind = \"sqlite\"\nurl = \"sqlite://data/swin.db\"\n\
                [[namespaces]]\nname = \"a\"\nwindow_sizes = [60]\nsync_rate = 1\nstore = \"main\"\n";
    let env = |k: &str| match k {
        "SWIN_STORE_MAIN_URL" => Some("sqlite::memory:".to_string()),
        "SWIN_DATA_DIR" => Some("/elsewhere".to_string()),
        "SWIN_MIGRATE" => Some("off".to_string()),
        _ => None,
    };
    let c = Config::parse("x", text, &env).expect("valid");
    assert_eq!(c.stores["main"].url(), "sqlite::memory:");
    assert_eq!(c.data_dir, Path::new("/elsewhere"));
    assert!(!c.migrate);
    // an override at fault is named
    let bad = |var: &'static str, value: &'static str| {
        move |k: &str| (k == var).then(|| value.to_string())
    };
    for (var, value, field) in [
        (
            "SWIN_STORE_MAIN_URL",
            "mysql://x",
            "stores.main.url (from SWIN_STORE_MAIN_URL)",
        ),
        ("SWIN_DATA_DIR", "", "data_dir (from SWIN_DATA_DIR)"),
        ("SWIN_MIGRATE", "maybe", "migrate"),
    ] {
        let e = Config::parse("x", text, &bad(var, value)).expect_err("invalid");
        assert_eq!(e.field, field, "{e}");
    }
}

#[test]
fn keys_of_the_program_embedding_the_library_are_left_to_it() {
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1\n";
    let text = format!("listen = \"127.0.0.1:1\"\n{ns}");
    // alone, the library takes none of them, and names every key it takes
    let e = Config::parse("f.toml", &text, &no_env).expect_err("not the library's");
    assert_eq!(e.field, "(toml, line 1, column 1)", "{e}");
    assert!(
        e.message
            .starts_with("unknown field `listen`, expected one of `migrate`, "),
        "{e}"
    );
    // within a program's file, its keys are its own; any other key is still refused,
    // both lists named
    let c = Config::parse_within("f.toml", &text, &no_env, &["listen"]).expect("valid");
    assert_eq!(c, Config::parse("f.toml", ns, &no_env).expect("valid"));
    let e = Config::parse_within(
        "f.toml",
        &format!("{ns}[bogus]\nx = 1\n"),
        &no_env,
        &["listen"],
    )
    .expect_err("no one's key");
    assert_eq!(e.field, "(toml, line 5, column 2)", "{e}");
    assert!(
        e.message
            .starts_with("unknown field `bogus`, expected one of `listen`, `migrate`, "),
        "{e}"
    );
    // a table given in code is checked alike
    let table: toml::Table = toml::from_str(&text).expect("toml");
    let e = Config::from_table("t", table).expect_err("not the library's");
    assert_eq!(e.field, "(toml)", "{e}");
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
