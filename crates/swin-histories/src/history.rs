//! What a run records: every request sent (node, start, end, kind, body, answer), and
//! how the attempts of one operation (a first send and its retries under one
//! `Idempotency-Key`) resolve to one outcome.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a request asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Hit,
    Increment,
    /// `/v1/hits` across namespaces.
    Batch,
    Refund,
    Reserve,
    Extend,
    Commit,
    /// A lease of `jobs` (`count` slots).
    Acquire,
    Renew,
    Release,
    /// `PUT` of a key's runtime limits.
    SetLimits,
    /// `DELETE` of a key's runtime limits.
    DeleteLimits,
    /// Envoy's `ShouldRateLimit` on `edge` (the answer recorded as `{"overall_code": …}`,
    /// a gRPC error as its HTTP counterpart with `{"grpc": code, "message": …}`).
    Rls,
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// An HTTP answer: its status and body, byte for byte.
    Status { status: u16, body: String },
    /// Sent, and no answer came (a timeout, the connection lost).
    Unknown { reason: String },
    /// Never reached a node (connection refused): nothing happened.
    NotSent { reason: String },
}

/// One request as sent and answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// The operation it belongs to: a retry shares its first send's.
    pub op: u64,
    pub client: usize,
    pub node: usize,
    /// Milliseconds since the run began.
    pub start_ms: u64,
    pub end_ms: u64,
    pub kind: Kind,
    /// The namespace of the route (a batch: its first item's).
    pub ns: String,
    /// The key of a key route; empty on a namespace route.
    pub key: String,
    pub path: String,
    pub body: Value,
    pub idem: Option<String>,
    pub answer: Answer,
}

/// How one operation ended, over all its attempts.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// An answer the request gave (2xx, 4xx): what it did is in it.
    Kept { status: u16, body: Value },
    /// It may or may not have taken effect.
    Unknown,
    /// Nothing was changed (refused before sending, or a 503 saying nothing changed).
    Nothing,
}

/// 503 codes that say nothing was changed (docs/api.md, "When the store does not answer").
const UNCHANGED: &[&str] = &[
    "store_unreachable",
    "store_failed",
    "unavailable",
    "idempotency_full",
];

/// The error code of an answer body, if any.
pub fn error_code(body: &Value) -> Option<&str> {
    body["error"]["code"].as_str()
}

impl Request {
    /// The answer's JSON body (`Null` when none or not JSON).
    pub fn json(&self) -> Value {
        match &self.answer {
            Answer::Status { body, .. } => serde_json::from_str(body).unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }

    /// Whether the answer is one the request gave and a replay must repeat: 2xx and
    /// 4xx, but not 409 `idempotency_in_progress` or 429 `exhausted` (the claim was
    /// not taken: nothing ran).
    pub fn kept(&self) -> bool {
        let Answer::Status { status, .. } = &self.answer else {
            return false;
        };
        let code = self.json();
        match *status {
            409 => error_code(&code) != Some("idempotency_in_progress"),
            429 => error_code(&code) != Some("exhausted"),
            s => (200..500).contains(&s),
        }
    }

    /// Whether this attempt may have changed something without saying what.
    pub fn unclear(&self) -> bool {
        match &self.answer {
            Answer::Unknown { .. } => true,
            Answer::NotSent { .. } => false,
            Answer::Status { status, .. } => {
                let v = self.json();
                *status >= 500 && !error_code(&v).is_some_and(|c| UNCHANGED.contains(&c))
            }
        }
    }

    /// One line for a report.
    pub fn line(&self) -> String {
        let answer = match &self.answer {
            Answer::Status { status, body } => format!("{status} {body}"),
            Answer::Unknown { reason } => format!("unknown ({reason})"),
            Answer::NotSent { reason } => format!("not sent ({reason})"),
        };
        let idem = self.idem.as_deref().unwrap_or("-");
        format!(
            "op {} client {} node {} {}..{} ms {:?} {} idem {} body {} -> {}",
            self.op,
            self.client,
            self.node,
            self.start_ms,
            self.end_ms,
            self.kind,
            self.path,
            idem,
            self.body,
            answer
        )
    }
}

/// The outcome of one operation's attempts, in the order sent: the first kept answer;
/// else unknown if any attempt was unclear; else nothing.
pub fn outcome(attempts: &[&Request]) -> Outcome {
    if let Some(r) = attempts.iter().find(|r| r.kept()) {
        let Answer::Status { status, .. } = &r.answer else {
            unreachable!("a kept answer has a status")
        };
        return Outcome::Kept {
            status: *status,
            body: r.json(),
        };
    }
    if attempts.iter().any(|r| r.unclear()) {
        Outcome::Unknown
    } else {
        Outcome::Nothing
    }
}

/// What a fault did, as the checks weigh it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disruption {
    /// The node was killed: what it took since its last successful sync may be lost.
    Kill,
    /// The node could not reach the store (cut, or the store paused): what it took
    /// then waits for the next successful sync.
    Away,
    /// A node's relay lost a store reply (seen by polling it: within 20 ms).
    ReplyLost,
    /// Nothing the checks weigh (a lost reply armed, a reload).
    Other,
}

/// One fault of the nemesis.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// The node it struck; `None`: every node (the store paused).
    pub node: Option<usize>,
    pub start_ms: u64,
    pub end_ms: u64,
    pub disruption: Disruption,
    pub what: String,
}
