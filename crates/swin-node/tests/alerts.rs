//! The alerting rules shipped in `deploy/prometheus/alerts.yml`, checked with Prometheus'
//! own tool: they load (`promtool check rules`) and each alert fires on the series it is
//! for, with its labels and annotations, and not before its `for:` (`promtool test rules`
//! over `alerts.test.yml`).

use std::path::Path;
use std::process::Command;

/// scripts/test sets SWIN_PROMTOOL, or leaves the promtool it unpacked under target/tools.
fn promtool() -> Command {
    let unpacked = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../target/tools/prometheus/usr/bin/promtool"
    );
    let path = std::env::var("SWIN_PROMTOOL").unwrap_or_else(|_| {
        if Path::new(unpacked).exists() {
            unpacked.into()
        } else {
            "promtool".into()
        }
    });
    let mut c = Command::new(path);
    c.current_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/prometheus"
    ));
    c
}

fn run(mut c: Command) -> String {
    let out = c.output().expect("promtool (scripts/test unpacks it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    said
}

#[test]
fn the_alerting_rules_load_and_fire_on_their_series() {
    let mut check = promtool();
    check.args(["check", "rules", "alerts.yml"]);
    let said = run(check);
    assert!(said.contains("SUCCESS: 7 rules found"), "{said}");
    let mut test = promtool();
    test.args(["test", "rules", "alerts.test.yml"]);
    let said = run(test);
    assert!(said.contains("SUCCESS"), "{said}");
}
