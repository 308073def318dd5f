//! How a namespace admits (`admission`, `on_store_failure`): eventual or strict, and
//! what strict admission needs of the rest of its entry.

use super::{ConfigError, Parser};

/// Why a strict namespace takes no limit in shadow.
pub const STRICT_SHADOW: &str = "a limit in shadow needs admission = \"eventual\"; a strict namespace goes in shadow whole (`shadow = true`)";

/// How a namespace with limits admits hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionMode {
    /// Decide on the local view of the cluster's counts (Kong's design): a node may admit
    /// past the limit by what the others admitted since its last sync.
    Eventual,
    /// Admit only from quota this node holds (windows) or was granted (buckets) from the store: never past the limit.
    Strict {
        /// What it does while its store cannot be asked.
        on_store_failure: OnStoreFailure,
    },
}

/// What a strict namespace does while its store cannot be asked (`local`: decide on
/// the local view, as eventual admission does; `deny`: refuse, 429 with reason
/// `store_unreachable`).
pub use swin_sync::admission::OnStoreFailure;

impl AdmissionMode {
    /// Its name in the config and in answers: `eventual` or `strict`.
    pub fn name(&self) -> &'static str {
        match self {
            AdmissionMode::Eventual => "eventual",
            AdmissionMode::Strict { .. } => "strict",
        }
    }
}

impl Parser<'_> {
    /// What strict admission needs: limits (or rules) to admit against, and a store.
    pub(super) fn strict(
        &self,
        admission: &AdmissionMode,
        limits: &Option<crate::policy::limits::Limits>,
        has_rules: bool,
        has_store: bool,
        shadow: Option<bool>,
        f: &dyn Fn(&str) -> String,
    ) -> Result<(), ConfigError> {
        if let AdmissionMode::Strict { .. } = admission {
            let why = match limits {
                None if has_rules && has_store => None,
                None if has_rules => Some("\"strict\" needs a store (sync_rate ≥ 0)"),
                None => Some("\"strict\" needs limits to admit against"),
                Some(_) if !has_store => Some("\"strict\" needs a store (sync_rate ≥ 0)"),
                Some(_) => None,
            };
            if let Some(why) = why {
                return Err(self.err(&f("admission"), why.into()));
            }
            Self::strict_shadow(limits, admission, shadow)
                .map_err(|(field, why)| self.err(&f(&field), why))?;
        }
        Ok(())
    }

    /// A strict namespace goes in shadow whole (`shadow = true`, never with
    /// `on_store_failure = "deny"`, which refuses): strict admission holds quota for
    /// every limit of a hit, so a limit cannot be in shadow beside limits enforced.
    fn strict_shadow(
        limits: &Option<crate::policy::limits::Limits>,
        admission: &AdmissionMode,
        shadow: Option<bool>,
    ) -> Result<(), crate::policy::FieldError> {
        if shadow == Some(true)
            && *admission
                == (AdmissionMode::Strict {
                    on_store_failure: OnStoreFailure::Deny,
                })
        {
            return Err((
                "on_store_failure".into(),
                "\"deny\" refuses hits; a namespace in shadow never does (\"local\" or leave it out)"
                    .into(),
            ));
        }
        let Some(limits) = limits else { return Ok(()) };
        let shadowed = std::iter::once(("limits".to_owned(), &limits.default)).chain(
            limits
                .overrides
                .iter()
                .map(|(k, l)| (format!("overrides (key {k:?})"), l)),
        );
        for (field, l) in shadowed {
            if l.has_shadow() {
                return Err((field, STRICT_SHADOW.into()));
            }
        }
        Ok(())
    }

    /// `admission` and `on_store_failure`.
    pub(super) fn admission(
        &self,
        admission: &Option<String>,
        on_store_failure: &Option<String>,
        f: &dyn Fn(&str) -> String,
    ) -> Result<AdmissionMode, ConfigError> {
        match (admission.as_deref(), on_store_failure.as_deref()) {
            (None | Some("eventual"), None) => Ok(AdmissionMode::Eventual),
            (None | Some("eventual"), Some(_)) => Err(self.err(
                &f("on_store_failure"),
                "only with admission = \"strict\"".into(),
            )),
            (Some("strict"), failure) => {
                let on_store_failure = match failure {
                    None | Some("local") => OnStoreFailure::Local,
                    Some("deny") => OnStoreFailure::Deny,
                    Some(other) => {
                        return Err(self.err(
                            &f("on_store_failure"),
                            format!("{other:?} is not \"local\" or \"deny\""),
                        ))
                    }
                };
                Ok(AdmissionMode::Strict { on_store_failure })
            }
            (Some(other), _) => Err(self.err(
                &f("admission"),
                format!("{other:?} is not \"eventual\" or \"strict\""),
            )),
        }
    }
}
