//! The configuration reference (`docs/configuration.md`) against the code: every key
//! the parser takes is listed and nothing else, every default listed is the code's, and
//! every environment variable listed overrides what it says.

use std::collections::BTreeSet;

use super::Config;

const REFERENCE: &str = include_str!("../../../../docs/configuration.md");

struct Row {
    key: String,
    /// A TOML value, or `None` for *required* and *none*.
    default: Option<String>,
    env: Option<String>,
}

/// The reference's tables, by section heading.
fn tables() -> Vec<(String, Vec<Row>)> {
    let mut out: Vec<(String, Vec<Row>)> = Vec::new();
    for line in REFERENCE.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            out.push((h.trim().to_owned(), Vec::new()));
            continue;
        }
        if !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cells.len() >= 5, "a row of four cells: {line}");
        let code = |c: &str| {
            c.strip_prefix('`')
                .and_then(|c| c.strip_suffix('`'))
                .map(str::to_owned)
        };
        let row = Row {
            key: code(cells[1]).expect("the key in backticks"),
            default: code(cells[2]),
            env: code(cells[3]),
        };
        out.last_mut().expect("a row under a heading").1.push(row);
    }
    out
}

fn section(name: &str) -> Vec<Row> {
    tables()
        .into_iter()
        .find(|(h, _)| h == name)
        .unwrap_or_else(|| panic!("no section {name:?} in the reference"))
        .1
}

const STORE: &str = "[stores.main]\nkind = \"sqlite\"\nurl = \"sqlite::memory:\"\n";
const NAMESPACE: &str = "[[namespaces]]\nname = \"a\"\nsync_rate = 1\nstore = \"main\"\n";

/// `text` parsed with `env`, as its `Debug` (the config has no `PartialEq`).
fn parsed(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    Config::parse("reference", text, env)
        .map(|c| format!("{c:?}"))
        .map_err(|e| e.to_string())
}

fn no_env(_: &str) -> Option<String> {
    None
}

/// The keys a table takes, as serde lists them when it meets one it does not.
fn keys_taken(text: &str) -> BTreeSet<String> {
    let e = parsed(text, &no_env).expect_err("an unknown key is refused");
    let (_, list) = e
        .split_once("expected ")
        .unwrap_or_else(|| panic!("no list of keys in {e:?}"));
    // "`a`, `b`" / "`a` or `b`" / "one of `a`, `b`, `c`": the names in backticks
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn keys_listed(rows: &[Row]) -> BTreeSet<String> {
    rows.iter().map(|r| r.key.clone()).collect()
}

/// The places a key of each table can be tried: configs with `{}` where the key goes.
fn bases(section: &str) -> Vec<String> {
    let ns = |extra: &str| format!("{STORE}{NAMESPACE}{extra}{{}}\n");
    match section {
        "Top level" => vec![format!("{{}}\n{STORE}{NAMESPACE}window_sizes = [60]\n")],
        "`[stores.NAME]`" => [
            "kind = \"sqlite\"\nurl = \"sqlite::memory:\"",
            "kind = \"postgres\"\nurl = \"postgres://h/d\"",
            "kind = \"redis\"\nurl = \"redis://h\"",
            "kind = \"redis_cluster\"\nurls = [\"redis://h:7000\"]",
        ]
        .iter()
        .map(|s| format!("[stores.main]\n{s}\n{{}}\n{NAMESPACE}window_sizes = [60]\n"))
        .collect(),
        "`[[namespaces]]`" => vec![
            ns("window_sizes = [60]\n"),
            ns("window_sizes = [60]\nlimits = [{ window_size = 60, limit = 5 }]\n"),
            ns("window_sizes = [60]\nlimits = [{ window_size = 60, limit = 5 }]\nadmission = \"strict\"\n"),
            ns("algorithm = \"gcra\"\ngcra = { burst = 5, count = 5, period = \"1m\" }\n"),
            ns("algorithm = \"concurrency\"\nlimit = 5\n"),
        ],
        "`[auth]`" => vec![format!("{STORE}{NAMESPACE}window_sizes = [60]\n[auth]\n{{}}\n")],
        "`[tls]`" => vec![format!(
            "{STORE}{NAMESPACE}window_sizes = [60]\n[tls]\ncert = \"c\"\nkey = \"k\"\n{{}}\n"
        )],
        "`[telemetry]`" => vec![format!(
            "{STORE}{NAMESPACE}window_sizes = [60]\n[telemetry]\notlp_endpoint = \"http://c:4317\"\n{{}}\n"
        )],
        "`[quota]`" => vec![format!("{STORE}{NAMESPACE}window_sizes = [60]\n[quota]\n{{}}\n")],
        other => panic!("no bases for {other:?}"),
    }
}

#[test]
fn the_reference_lists_every_key_with_the_code_defaults() {
    let sections = [
        "Top level",
        "`[stores.NAME]`",
        "`[[namespaces]]`",
        "`[auth]`",
        "`[tls]`",
        "`[telemetry]`",
        "`[quota]`",
    ];
    for name in sections {
        let rows = section(name);
        let bases = bases(name);
        // every key taken is listed, and only those
        let taken = keys_taken(&bases[0].replace("{}", "zz_not_a_key = 1"));
        assert_eq!(
            keys_listed(&rows),
            taken,
            "{name}: keys listed against keys taken"
        );
        // every default listed is what the code does without the key
        for row in &rows {
            let Some(default) = &row.default else {
                continue;
            };
            // the tables of stores and namespaces: their keys have sections of their own
            if name == "Top level" && matches!(row.key.as_str(), "stores" | "namespaces") {
                continue;
            }
            let tried: Vec<(String, String)> = bases
                .iter()
                .filter_map(|b| {
                    let without = parsed(&b.replace("{}", ""), &no_env).ok()?;
                    let with = parsed(
                        &b.replace("{}", &format!("{} = {default}", row.key)),
                        &no_env,
                    )
                    .ok()?;
                    Some((without, with))
                })
                .collect();
            assert!(
                !tried.is_empty(),
                "{name}: `{} = {default}` fits no config this test knows",
                row.key
            );
            for (without, with) in tried {
                assert_eq!(
                    without, with,
                    "{name}: `{}`'s default is not {default}",
                    row.key
                );
            }
        }
    }
}

/// A value for each variable the reference lists, and the config it overrides.
fn env_case(var: &str) -> (&'static str, String) {
    let plain = format!("{STORE}{NAMESPACE}window_sizes = [60]\n");
    let cluster = format!(
        "[stores.main]\nkind = \"redis_cluster\"\nurls = [\"redis://h:7000\"]\n{NAMESPACE}window_sizes = [60]\n"
    );
    match var {
        "SWIN_LISTEN" => ("127.0.0.1:1", plain),
        "SWIN_GRPC_LISTEN" => ("127.0.0.1:2", plain),
        "SWIN_MIGRATE" => ("false", plain),
        "SWIN_LOG_FORMAT" => ("json", plain),
        "SWIN_DATA_DIR" => ("/elsewhere", plain),
        "SWIN_STORE_MAIN_URL" => ("sqlite:///elsewhere.db", plain),
        "SWIN_STORE_MAIN_URLS" => ("redis://10.9.9.9:7000,redis://10.9.9.8:7000", cluster),
        other => panic!("the reference lists {other}, which this test does not know"),
    }
}

#[test]
fn every_variable_in_the_reference_overrides_its_key() {
    let mut vars = BTreeSet::new();
    for (_, rows) in tables() {
        for row in rows {
            if let Some(var) = row.env {
                vars.insert(var.replace("<NAME>", "MAIN"));
            }
        }
    }
    assert!(vars.len() >= 7, "{vars:?}");
    for var in &vars {
        let (value, text) = env_case(var);
        let without = parsed(&text, &no_env).expect("valid");
        let env = |k: &str| (k == var).then(|| value.to_owned());
        let with = parsed(&text, &env).unwrap_or_else(|e| panic!("{var}={value}: {e}"));
        assert_ne!(without, with, "{var} changes nothing");
    }
}
