//! The answer's dynamic metadata (`envoy_dynamic_metadata = true`), in the shape
//! envoyproxy/ratelimit writes with `RESPONSE_DYNAMIC_METADATA`: the domain, each request
//! descriptor (its entries as `key=value`, its own limit and hits), the request's hits,
//! and the `metadata` of every rule whose descriptor was not over its limit, merged (a
//! key already there stays; two maps under one key merge, recursively).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

use swin::requests::Answer;

/// The dynamic metadata of the answer to `req`: `answers[i]` is descriptor `i`'s.
pub fn of(req: &RateLimitRequest, answers: &[Answer]) -> Struct {
    let mut out = Struct::default();
    out.fields
        .insert("domain".into(), string(req.domain.clone()));
    let descriptors = req.descriptors.iter().map(descriptor).collect();
    out.fields.insert("descriptors".into(), list(descriptors));
    if req.hits_addend != 0 {
        out.fields
            .insert("hitsAddend".into(), number(f64::from(req.hits_addend)));
    }
    let mut merged = Struct::default();
    for m in answers.iter().filter_map(Answer::metadata) {
        merge(&mut merged, &from_json_map(m));
    }
    if !merged.fields.is_empty() {
        out.fields.insert("metadata".into(), structure(merged));
    }
    out
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut s = Struct::default();
    let entries = d
        .entries
        .iter()
        .map(|e| string(format!("{}={}", e.key, e.value)))
        .collect();
    s.fields.insert("entries".into(), list(entries));
    if let Some(l) = &d.limit {
        let unit = RateLimitUnit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name());
        s.fields.insert(
            "limit".into(),
            string(format!(
                "requests_per_unit:{} unit:{unit}",
                l.requests_per_unit
            )),
        );
    }
    if let Some(h) = d.hits_addend {
        s.fields.insert("hitsAddend".into(), number(h.value as f64));
    }
    structure(s)
}

/// `src`'s keys into `dest`: a key `dest` has stays, unless both are maps (merged).
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match dest.fields.get_mut(k) {
            None => {
                dest.fields.insert(k.clone(), v.clone());
            }
            Some(Value {
                kind: Some(Kind::StructValue(d)),
            }) => {
                if let Some(Kind::StructValue(s)) = &v.kind {
                    merge(d, s);
                }
            }
            Some(_) => {}
        }
    }
}

fn from_json_map(m: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: m.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
    }
}

fn from_json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(from_json).collect(),
        }),
        J::Object(m) => Kind::StructValue(from_json_map(m)),
    };
    Value { kind: Some(kind) }
}

fn string(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Struct {
        let v: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).expect("json");
        from_json_map(&v)
    }

    #[test]
    fn merging_keeps_the_first_value_and_merges_maps() {
        let mut dest = json(r#"{"a": 1, "m": {"x": "first"}}"#);
        merge(
            &mut dest,
            &json(r#"{"a": 2, "b": true, "m": {"x": "second", "y": [1]}}"#),
        );
        assert_eq!(
            dest,
            json(r#"{"a": 1, "b": true, "m": {"x": "first", "y": [1]}}"#)
        );
    }
}
