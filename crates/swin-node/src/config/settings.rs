//! The daemon's own settings at the config's top level: its listeners' addresses and
//! connections, logging, TLS, telemetry and trusted proxies.

use std::net::SocketAddr;

use serde::Deserialize;
use swin::config::ConfigError;
use swin::policy::client_address::trusted_proxy;

use super::{defaults, ConnectionLimits, LogFormat, Parser, RawNode, TelemetryConfig, TlsConfig};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    otlp_endpoint: Option<String>,
    service_name: Option<String>,
    sample_ratio: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    cert: String,
    key: String,
    client_ca: Option<String>,
}

impl Parser<'_> {
    /// A listener's address (`key`, or the environment variable `var`); `default` when
    /// neither sets it.
    pub(super) fn address(
        &self,
        key: &str,
        var: &str,
        raw: Option<String>,
        default: Option<&str>,
    ) -> Result<Option<SocketAddr>, ConfigError> {
        let (value, field) = self.overridden(key, var, raw);
        let Some(value) = value.or_else(|| default.map(str::to_owned)) else {
            return Ok(None);
        };
        let example = if key == "listen" {
            "127.0.0.1:7070"
        } else {
            "127.0.0.1:8081"
        };
        value.parse().map(Some).map_err(|_| {
            self.err(
                &field,
                format!("{value:?} is not an address like {example}"),
            )
        })
    }

    /// `log_format`, or `SWIN_LOG_FORMAT`.
    pub(super) fn log_format(&self, raw: Option<String>) -> Result<LogFormat, ConfigError> {
        let (log_format, field) = self.overridden("log_format", "SWIN_LOG_FORMAT", raw);
        match log_format.as_deref() {
            None | Some("pretty") => Ok(LogFormat::Pretty),
            Some("json") => Ok(LogFormat::Json),
            Some(other) => {
                Err(self.err(&field, format!("{other:?} is not \"pretty\" or \"json\"")))
            }
        }
    }

    /// The timeouts and the cap of both listeners' connections.
    pub(super) fn connections(&self, raw: &RawNode) -> Result<ConnectionLimits, ConfigError> {
        let connections = ConnectionLimits {
            header_timeout: self.secs(
                "header_timeout",
                raw.header_timeout,
                defaults::HEADER_TIMEOUT_SECS,
            )?,
            idle_timeout: self.secs(
                "idle_timeout",
                raw.idle_timeout,
                defaults::IDLE_TIMEOUT_SECS,
            )?,
            body_timeout: self.secs(
                "body_timeout",
                raw.body_timeout,
                defaults::BODY_TIMEOUT_SECS,
            )?,
            max_connections: raw.max_connections.unwrap_or(defaults::MAX_CONNECTIONS),
        };
        if connections.max_connections == 0 {
            return Err(self.err("max_connections", "must be above 0".into()));
        }
        Ok(connections)
    }

    /// `[tls]`: each file named.
    pub(super) fn tls(&self, raw: Option<RawTls>) -> Result<Option<TlsConfig>, ConfigError> {
        match raw {
            None => Ok(None),
            Some(t) if t.cert.is_empty() => {
                Err(self.err("tls.cert", "must name a PEM file".into()))
            }
            Some(t) if t.key.is_empty() => Err(self.err("tls.key", "must name a PEM file".into())),
            Some(t) if t.client_ca.as_deref() == Some("") => {
                Err(self.err("tls.client_ca", "must name a PEM file".into()))
            }
            Some(t) => Ok(Some(TlsConfig {
                cert: t.cert.into(),
                key: t.key.into(),
                client_ca: t.client_ca.map(Into::into),
            })),
        }
    }

    /// `[telemetry]`: nothing without `otlp_endpoint`; an `http://` or `https://` URL
    /// with a host, a service name, a ratio from 0 to 1.
    pub(super) fn telemetry(
        &self,
        raw: Option<RawTelemetry>,
    ) -> Result<Option<TelemetryConfig>, ConfigError> {
        let Some(raw) = raw else { return Ok(None) };
        let Some(endpoint) = raw.otlp_endpoint else {
            if raw.service_name.is_some() || raw.sample_ratio.is_some() {
                return Err(self.err(
                    "telemetry.otlp_endpoint",
                    "is required for traces (service_name and sample_ratio need it)".into(),
                ));
            }
            return Ok(None);
        };
        let uri: Option<axum::http::Uri> = endpoint.parse().ok();
        let valid = uri.as_ref().is_some_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https"))
                && u.host().is_some_and(|h| !h.is_empty())
        });
        if !valid {
            return Err(self.err(
                "telemetry.otlp_endpoint",
                format!("{endpoint:?} is not an http:// or https:// URL of a collector (http://127.0.0.1:4317)"),
            ));
        }
        let service_name = raw.service_name.unwrap_or_else(|| "swin-node".into());
        if service_name.trim().is_empty() {
            return Err(self.err("telemetry.service_name", "must not be empty".into()));
        }
        let sample_ratio = raw.sample_ratio.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&sample_ratio) {
            return Err(self.err(
                "telemetry.sample_ratio",
                format!("{sample_ratio} is not a share from 0 to 1"),
            ));
        }
        Ok(Some(TelemetryConfig {
            otlp_endpoint: endpoint,
            service_name,
            sample_ratio,
        }))
    }

    /// CIDRs (`10.0.0.0/8`, `::1/128`) or single addresses.
    pub(super) fn trusted_proxies(&self, raw: &[String]) -> Result<Vec<ipnet::IpNet>, ConfigError> {
        raw.iter()
            .enumerate()
            .map(|(i, s)| {
                trusted_proxy(s)
                    .map_err(|e| self.err(&format!("trusted_proxies[{i}]"), e.to_string()))
            })
            .collect()
    }
}
