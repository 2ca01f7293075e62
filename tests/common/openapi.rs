//! Real API responses checked against the OpenAPI description (`openapi/openapi.json`):
//! [`check`] finds the schema of an operation's answer and validates a body with it.
//!
//! The validator knows the JSON Schema keywords the description uses (`$ref`, `type`,
//! `enum`, `const`, `properties`, `required`, `additionalProperties`, `items`, `oneOf`,
//! `anyOf`, `allOf`, `minimum`, `minItems`, `maxItems`, `minLength`, `maxLength`) and
//! refuses a schema with any other keyword but annotations (`description`, `format`,
//! `default`, `pattern`, `x-*`), so a keyword added later cannot be skipped unnoticed;
//! `pattern` and `format` are annotations here (not checked).

use serde_json::Value;

const CHECKED: [&str; 16] = [
    "$ref",
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "oneOf",
    "anyOf",
    "allOf",
    "minimum",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
];
const ANNOTATIONS: [&str; 4] = ["description", "format", "default", "pattern"];

/// The description as built into the binary.
pub fn doc() -> Value {
    serde_json::from_str(fairway::api::openapi::DESCRIPTION).expect("the OpenAPI description is JSON")
}

fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => resolve(doc, doc.pointer(r.trim_start_matches('#')).unwrap_or_else(|| panic!("no {r}"))),
        None => v,
    }
}

/// Validates `body`, the answer `status` of `method path` (the path as described, e.g.
/// `/v1/jobs/{id}`), against its JSON schema; panics naming every difference.
pub fn check(method: &str, path: &str, status: u16, body: &Value) {
    let doc = doc();
    let op =
        doc["paths"][path].get(method.to_lowercase()).unwrap_or_else(|| panic!("{method} {path} is not described"));
    let resp = op["responses"]
        .get(status.to_string())
        .unwrap_or_else(|| panic!("{method} {path}: answer {status} is not described"));
    let resp = resolve(&doc, resp);
    let schema = &resp["content"]["application/json"]["schema"];
    assert!(!schema.is_null(), "{method} {path} {status}: no application/json schema described");
    let mut errors = Vec::new();
    validate(&doc, schema, body, "$", &mut errors);
    assert!(
        errors.is_empty(),
        "{method} {path} {status}: the answer does not fit the description:\n{}\nbody: {body}",
        errors.join("\n")
    );
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Validates `v` at `at` against `schema`, pushing what does not fit to `errors`.
pub fn validate(doc: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(s) = schema.as_object() else {
        if schema == &Value::Bool(false) {
            errors.push(format!("{at}: no value is allowed here"));
        }
        return;
    };
    for k in s.keys() {
        assert!(
            CHECKED.contains(&k.as_str()) || ANNOTATIONS.contains(&k.as_str()) || k.starts_with("x-"),
            "the description uses the keyword {k:?}, which tests/common/openapi.rs does not check: teach it"
        );
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let target = doc.pointer(r.trim_start_matches('#')).unwrap_or_else(|| panic!("no {r}"));
        validate(doc, target, v, at, errors);
    }
    let t = type_of(v);
    if let Some(want) = s.get("type") {
        let allowed: Vec<&str> = match want {
            Value::String(w) => vec![w.as_str()],
            Value::Array(ws) => ws.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !allowed.iter().any(|w| *w == t || (*w == "number" && t == "integer")) {
            errors.push(format!("{at}: {t}, want {allowed:?}"));
            return;
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            errors.push(format!("{at}: {v} is not one of {e:?}"));
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            errors.push(format!("{at}: {v}, want {c}"));
        }
    }
    if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if n < min {
            errors.push(format!("{at}: {n} < minimum {min}"));
        }
    }
    if let Some(text) = v.as_str() {
        let n = text.chars().count() as u64;
        if s.get("minLength").and_then(Value::as_u64).is_some_and(|m| n < m)
            || s.get("maxLength").and_then(Value::as_u64).is_some_and(|m| n > m)
        {
            errors.push(format!("{at}: length {n} out of bounds"));
        }
    }
    if let Some(items) = v.as_array() {
        let n = items.len() as u64;
        if s.get("minItems").and_then(Value::as_u64).is_some_and(|m| n < m)
            || s.get("maxItems").and_then(Value::as_u64).is_some_and(|m| n > m)
        {
            errors.push(format!("{at}: {n} items out of bounds"));
        }
        if let Some(item) = s.get("items") {
            for (i, x) in items.iter().enumerate() {
                validate(doc, item, x, &format!("{at}[{i}]"), errors);
            }
        }
    }
    if let Some(obj) = v.as_object() {
        for r in s.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            if !obj.contains_key(r) {
                errors.push(format!("{at}: required field {r:?} is missing"));
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, x) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(p) => validate(doc, p, x, &format!("{at}.{k}"), errors),
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => errors.push(format!("{at}: field {k:?} is not described")),
                    Some(extra @ Value::Object(_)) => validate(doc, extra, x, &format!("{at}.{k}"), errors),
                    _ => {}
                },
            }
        }
    }
    for x in s.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        validate(doc, x, v, at, errors);
    }
    let fits = |x: &Value| {
        let mut e = Vec::new();
        validate(doc, x, v, at, &mut e);
        e.is_empty()
    };
    if let Some(one) = s.get("oneOf").and_then(Value::as_array) {
        let n = one.iter().filter(|x| fits(x)).count();
        if n != 1 {
            errors.push(format!("{at}: fits {n} of the oneOf schemas, want exactly 1"));
        }
    }
    if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
        if !any.iter().any(fits) {
            errors.push(format!("{at}: fits none of the anyOf schemas"));
        }
    }
}
