//! Who sends a request, as the caps a client is held to count it: the idempotency
//! records and open reservations it may hold in a namespace, and its share of a quota
//! bucket and its streams.

use std::net::IpAddr;

/// Who sends a request. A door names the client it knows: by the token it presented,
/// else by its address. Two kinds never name one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Client {
    /// The client presenting the token configured under this name (its name, never the
    /// token). Its idempotency keys are its own: another token's request under the same
    /// key is another record.
    Token(String),
    /// A client known by its address (an IPv6 one by its /64, as a limit keys a client
    /// address: one client, however many addresses of it it sends from). Its
    /// idempotency keys are the namespace's: a retry may come through another proxy.
    Address(IpAddr),
    /// Nothing is known of it (no token, no address): all such are one client.
    Unknown,
}
