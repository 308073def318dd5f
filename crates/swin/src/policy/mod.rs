//! Policy: what a request is decided against, with no I/O and no front door — a
//! namespace's algorithm (`algorithm`), its limits and overrides (`limits`), Envoy's
//! descriptor rules and how a descriptor finds its rule (`rules`), the counter key a
//! descriptor counts on (`keys`), what a request may carry ([`input`]), and the
//! RateLimit headers of a decision (`headers`), and the client address a request comes
//! from behind trusted proxies ([`client_address`]). Config builds these from its raw types;
//! `decisions` and the front doors (`http`, `rls`) use them; nothing here imports either.

pub(crate) mod algorithm;

/// A time of the store's clock (Unix milliseconds) as the library's answers give it.
pub(crate) fn system_time(t: swin_core::UnixMs) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(t.0.max(0) as u64)
}

pub mod client_address;
pub(crate) mod headers;
pub mod input;
pub(crate) mod keys;
pub(crate) mod limits;
pub(crate) mod rules;

/// A config error: the field (under the namespace) and why.
pub(crate) type FieldError = (String, String);
