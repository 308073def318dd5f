//! The library's own settings at the config's top level: migrations, the data
//! directory and the caps of Envoy's quota service (the timeouts are in `mod.rs`).

use super::{defaults, parse_bool, ConfigError, Parser, RawQuota};

impl Parser<'_> {
    /// `migrate`, or `SWIN_MIGRATE`; true unless told otherwise.
    pub(super) fn migrate(&self, raw: Option<bool>) -> Result<bool, ConfigError> {
        match (self.env)("SWIN_MIGRATE") {
            Some(v) => parse_bool(&v).ok_or_else(|| {
                self.err(
                    "migrate",
                    format!("SWIN_MIGRATE={v:?} is not true or false"),
                )
            }),
            None => Ok(raw.unwrap_or(true)),
        }
    }

    /// `data_dir`, or `SWIN_DATA_DIR`.
    pub(super) fn data_dir(&self, raw: Option<String>) -> Result<std::path::PathBuf, ConfigError> {
        let (data_dir, field) = self.overridden("data_dir", "SWIN_DATA_DIR", raw);
        let data_dir = data_dir.unwrap_or_else(|| defaults::DATA_DIR.into());
        if data_dir.is_empty() {
            return Err(self.err(&field, "must not be empty".into()));
        }
        Ok(data_dir.into())
    }

    /// `[quota]`: each cap at least 1.
    pub(super) fn quota(
        &self,
        raw: Option<RawQuota>,
    ) -> Result<crate::config::QuotaLimits, ConfigError> {
        let d = crate::config::QuotaLimits::default();
        let Some(raw) = raw else { return Ok(d) };
        let at_least_one = |field: &str, v: Option<usize>, default: usize| match v {
            Some(0) => Err(self.err(field, "must be at least 1".into())),
            v => Ok(v.unwrap_or(default)),
        };
        Ok(crate::config::QuotaLimits {
            streams_per_client: at_least_one(
                "quota.streams_per_client",
                raw.streams_per_client,
                d.streams_per_client,
            )?,
            buckets_per_stream: at_least_one(
                "quota.buckets_per_stream",
                raw.buckets_per_stream,
                d.buckets_per_stream,
            )?,
            buckets_per_client: at_least_one(
                "quota.buckets_per_client",
                raw.buckets_per_client,
                d.buckets_per_client,
            )?,
            buckets: at_least_one("quota.buckets", raw.buckets, d.buckets)?,
        })
    }
}
