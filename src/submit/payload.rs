//! A job's payload as a user submits it: any JSON value, read without building its tree
//! (serde_json's `RawValue`: the parser checks the text and keeps it, so a deeply or
//! widely nested payload costs its bytes, not a tree of values), and kept as the bytes
//! the job carries:
//! - a JSON string is its text (`"hello"` carries `hello`);
//! - `null`, or no `payload` field, is empty;
//! - anything else is its JSON text without insignificant whitespace.

use serde::{Deserialize, Deserializer};

/// The bytes a job carries (see the module docs for how JSON maps to them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Payload(Vec<u8>);

impl Payload {
    /// Bytes as they are (a record read back from a topic).
    pub fn bytes(b: Vec<u8>) -> Payload {
        Payload(b)
    }

    /// A text payload.
    pub fn text(s: impl Into<String>) -> Payload {
        Payload(s.into().into_bytes())
    }

    /// The payload of a JSON value (strings as their text, `null` empty).
    pub fn json(v: &serde_json::Value) -> Payload {
        match v {
            serde_json::Value::Null => Payload::default(),
            serde_json::Value::String(s) => Payload::text(s.as_str()),
            v => Payload(v.to_string().into_bytes()),
        }
    }

    /// The payload of JSON text already checked by the parser.
    fn of_json_text(text: &str) -> Result<Payload, serde_json::Error> {
        match text.as_bytes().first() {
            Some(b'"') => Ok(Payload::text(serde_json::from_str::<String>(text)?)),
            Some(b'n') => Ok(Payload::default()),
            _ => Ok(Payload(compact(text))),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<serde_json::Value> for Payload {
    fn from(v: serde_json::Value) -> Payload {
        Payload::json(&v)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Payload, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        Payload::of_json_text(raw.get()).map_err(serde::de::Error::custom)
    }
}

/// Valid JSON text without the whitespace outside its strings.
fn compact(json: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in json.as_bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if b.is_ascii_whitespace() {
            continue;
        }
        out.push(b);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parsed(text: &str) -> Payload {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn strings_are_their_text_null_is_empty_the_rest_compact_json() {
        assert_eq!(parsed(r#""hello \"you\"""#).as_bytes(), br#"hello "you""#);
        assert!(parsed("null").is_empty());
        assert_eq!(
            parsed(r#" { "ms" : 5, "s": "a b\\" , "l": [1, 2] } "#).as_bytes(),
            br#"{"ms":5,"s":"a b\\","l":[1,2]}"#
        );
        assert!(serde_json::from_str::<Payload>("[1,").is_err());
    }

    #[test]
    fn a_wide_payload_is_held_as_its_bytes() {
        let text = format!("[{}0]", "0, ".repeat(1 << 20));
        let p = parsed(&text);
        assert_eq!(p.len(), (1 << 21) + 3);
    }

    proptest! {
        /// Read raw, a payload carries the same bytes as the JSON value it is.
        #[test]
        fn raw_and_tree_agree(v in json_value()) {
            let pretty = serde_json::to_string_pretty(&v).unwrap();
            prop_assert_eq!(parsed(&pretty), Payload::json(&v));
        }
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[ a-z\"\\\\\n\t{}:,]{0,12}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[a-z \"]{0,6}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
