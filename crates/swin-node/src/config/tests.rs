//! The daemon config's tests: every shipped file parses, the daemon's defaults and
//! environment overrides, the split with the library's keys, tokens; each daemon key's
//! checks, and the field every error names, in `checks`.

use std::path::Path;
use std::time::Duration;

use super::*;

mod checks;

fn no_env(_: &str) -> Option<String> {
    None
}

/// The field a config error blames (`file: field: why`).
fn field_of(e: &ConfigError) -> String {
    let said = e.to_string();
    let (_, rest) = said.split_once(": ").expect("file: field: why");
    rest.split_once(": ").expect("field: why").0.to_owned()
}

fn fails(text: &str, field: &str) {
    let e = Config::parse("f.toml", text, &no_env).expect_err("invalid");
    assert_eq!(field_of(&e), field, "{e}");
    assert!(e.to_string().starts_with("f.toml: "), "{e}");
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
    assert_eq!(
        c.limiter().stores()["main"].kind(),
        swin::config::StoreKind::Sqlite
    );
    let ns = &c.limiter().namespaces()[0];
    assert_eq!(ns.name(), "default");
    // the library took the file's namespace as it is written
    let file: toml::Table = toml::from_str(DEFAULT_CONFIG).expect("toml");
    assert_eq!(
        file["namespaces"][0]["window_sizes"],
        toml::Value::Array(vec![1.into(), 60.into(), 3600.into()])
    );
}

#[test]
fn defaults_fill_what_a_config_leaves_out() {
    let c = Config::parse(
        "x",
        "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1",
        &no_env,
    )
    .expect("valid");
    assert_eq!(c.listen.to_string(), defaults::LISTEN);
    assert_eq!(c.grpc_listen, None);
    assert_eq!(c.log_format, LogFormat::Pretty);
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
    assert!(c.auth.is_none() && c.tls.is_none() && c.telemetry.is_none());
}

#[test]
fn the_file_is_split_between_the_daemon_and_the_library() {
    let ns = "[[namespaces]]\nname = \"a\"\nwindow_sizes = [1]\nsync_rate = -1\n";
    let text = format!("listen = \"127.0.0.1:9\"\nmax_batch = 5\nstore_timeout = 2\n{ns}");
    let c = Config::parse("f.toml", &text, &no_env).expect("valid");
    assert_eq!(c.listen.to_string(), "127.0.0.1:9");
    assert_eq!(c.max_batch, 5);
    // the library's share is what the library reads of the same file without the
    // daemon's keys
    let library = swin::config::Config::parse_within(
        "f.toml",
        &format!("store_timeout = 2\n{ns}"),
        &no_env,
        &[],
    )
    .expect("valid");
    assert_eq!(c.limiter(), &library);
    assert_eq!(c.limiter().store_timeout(), Duration::from_secs(2));
    // a key neither takes is refused where it stands, every key of both named
    let e = Config::parse(
        "f.toml",
        &format!("max_batch = 5\nlistne = \"x\"\n{ns}"),
        &no_env,
    )
    .expect_err("no one's key");
    assert_eq!(field_of(&e), "(toml, line 2, column 1)", "{e}");
    for key in KEYS.iter().chain(["store_timeout", "namespaces"].iter()) {
        assert!(e.to_string().contains(&format!("`{key}`")), "{key}: {e}");
    }
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
    assert_eq!(c.limiter().stores()["main"].url(), "sqlite::memory:");
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
        assert_eq!(field_of(&e), field, "{e}");
    }
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
        assert_eq!(field_of(&e), field, "{e}");
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
