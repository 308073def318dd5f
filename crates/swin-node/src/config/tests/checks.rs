//! Every error of a daemon key names its field (the library's are checked in the
//! library).

use super::*;

#[test]
fn errors_name_the_field() {
    fails("listen = \"nope\"", "listen");
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
    fails("listen = \"127.0.0.1:1\"\n", "namespaces");
    fails("bogus = 1", "(toml, line 1, column 1)");
    fails(
        "listen = \"127.0.0.1:1\"\nmigrate = maybe\n",
        "(toml, line 2, column 11)",
    );
    fails("listen = 5", "(toml, line 1, column 10)");
    fails(
        "[tls]\ncert = \"c\"\nkey = \"k\"\nca = \"x\"",
        "(toml, line 4, column 1)",
    );
}

#[test]
fn grpc_listen_is_checked() {
    let ns = "[[namespaces]]\nname = \"edge\"\nsync_rate = -1\n";
    let rule = "[[namespaces.descriptors]]\nkey = \"k\"\nrate_limit = { unit = \"minute\", requests_per_unit = 5 }\n";
    let c = Config::parse(
        "f.toml",
        &format!("grpc_listen = \"127.0.0.1:8081\"\n{ns}{rule}"),
        &no_env,
    )
    .expect("valid");
    assert_eq!(c.grpc_listen, Some("127.0.0.1:8081".parse().expect("addr")));
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
