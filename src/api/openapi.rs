//! The API's OpenAPI 3.1 description (`openapi/openapi.json`, kept in the repository and
//! built into the binary), served without a key at `GET /v1/openapi.json`.
//!
//! The tests below hold it to the code: every route of [`super::ROUTES`] (the table the
//! router is built from) is described with its path parameters and nothing else is, the
//! query parameters of the routes whose query types refuse unknown fields are the
//! described ones, and every error code of a `codes` module in `src/api` is in the
//! `ErrorCode` enum (and no other).

use axum::http::header;
use axum::response::IntoResponse;

/// The description, as served.
pub const DESCRIPTION: &str = include_str!("../../openapi/openapi.json");

/// `GET /v1/openapi.json`.
pub(super) async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DESCRIPTION)
}

#[cfg(test)]
mod tests {
    use super::super::ROUTES;
    use super::DESCRIPTION;
    use serde_json::Value;
    use std::collections::BTreeSet;

    const METHODS: [&str; 7] = ["get", "put", "post", "delete", "patch", "head", "options"];

    fn doc() -> Value {
        serde_json::from_str(DESCRIPTION).expect("openapi/openapi.json is JSON")
    }

    fn operation<'a>(doc: &'a Value, method: &str, path: &str) -> Option<&'a Value> {
        doc["paths"].get(path)?.get(method)
    }

    /// The parameters of an operation (and of its path item) that are `in` `place`.
    fn params(doc: &Value, method: &str, path: &str, place: &str) -> BTreeSet<String> {
        let op = operation(doc, method, path).into_iter();
        let item = doc["paths"].get(path).into_iter();
        item.chain(op)
            .filter_map(|v| v["parameters"].as_array())
            .flatten()
            .filter(|p| p["in"] == place)
            .filter_map(|p| p["name"].as_str().map(str::to_string))
            .collect()
    }

    #[test]
    fn the_description_is_openapi_3_1_and_every_reference_resolves() {
        let doc = doc();
        assert_eq!(doc["openapi"], "3.1.0");
        fn refs(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref") {
                        out.push(r.clone());
                    }
                    m.values().for_each(|v| refs(v, out));
                }
                Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(!all.is_empty());
        for r in all {
            let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{r} is not a local reference"));
            assert!(doc.pointer(pointer).is_some(), "{r} points at nothing in openapi/openapi.json");
        }
    }

    type Routes = Vec<(String, String)>;

    /// (routed but not described, described but not routed), as (method, path).
    fn route_differences(doc: &Value) -> (Routes, Routes) {
        let routed: BTreeSet<(String, String)> =
            ROUTES.iter().map(|r| (r.method.as_str().to_lowercase(), r.path.to_string())).collect();
        assert_eq!(routed.len(), ROUTES.len(), "ROUTES lists a method and path twice");
        let described: BTreeSet<(String, String)> = doc["paths"]
            .as_object()
            .expect("paths")
            .iter()
            .flat_map(|(path, item)| {
                METHODS.iter().filter(|m| item.get(**m).is_some()).map(|m| (m.to_string(), path.clone()))
            })
            .collect();
        (routed.difference(&described).cloned().collect(), described.difference(&routed).cloned().collect())
    }

    #[test]
    fn every_route_of_the_router_is_described_and_nothing_else() {
        let (missing, extra) = route_differences(&doc());
        assert!(
            missing.is_empty() && extra.is_empty(),
            "openapi/openapi.json and api::ROUTES differ: routes not described {missing:?}; described but not \
             routed {extra:?}"
        );
    }

    #[test]
    fn the_route_check_sees_a_route_without_a_description_and_one_without_a_handler() {
        let mut d = doc();
        d["paths"].as_object_mut().expect("paths").remove("/v1/usage");
        let (missing, extra) = route_differences(&d);
        assert_eq!((missing, extra), (vec![("get".to_string(), "/v1/usage".to_string())], vec![]));
        let mut d = doc();
        d["paths"]["/v1/jobs/{id}"]["put"] = serde_json::json!({"responses": {}});
        let (missing, extra) = route_differences(&d);
        assert_eq!((missing, extra), (vec![], vec![("put".to_string(), "/v1/jobs/{id}".to_string())]));
    }

    #[test]
    fn every_path_parameter_is_described() {
        let doc = doc();
        for r in ROUTES {
            let method = r.method.as_str().to_lowercase();
            let in_path: BTreeSet<String> = r
                .path
                .split('/')
                .filter_map(|seg| Some(seg.strip_prefix('{')?.strip_suffix('}')?.to_string()))
                .collect();
            assert_eq!(
                params(&doc, &method, r.path, "path"),
                in_path,
                "{} {}: the described path parameters differ from the route's",
                r.method,
                r.path
            );
        }
    }

    /// The field names of a query type that refuses unknown fields, from its own error.
    fn fields_of<T: serde::de::DeserializeOwned + std::fmt::Debug>() -> BTreeSet<String> {
        let e = serde_json::from_str::<T>(r#"{"\u0001": 0}"#).expect_err("an unknown field is refused");
        let text = e.to_string();
        let expected = text.split("expected").nth(1).unwrap_or_else(|| panic!("no field list in {text:?}"));
        expected.split('`').skip(1).step_by(2).map(str::to_string).collect()
    }

    #[test]
    fn query_parameters_are_the_handlers_own() {
        let doc = doc();
        let cases = [
            ("get", "/v1/jobs/{id}/events", fields_of::<super::super::events::EventsQuery>()),
            ("get", "/v1/events", fields_of::<super::super::events::EventsQuery>()),
            ("get", "/v1/usage", fields_of::<super::super::usage::ReportParams>()),
            ("get", "/v1/alerts", fields_of::<super::super::usage::AlertParams>()),
            ("get", "/v1/admin/usage", fields_of::<super::super::usage::ExportParams>()),
        ];
        for (method, path, fields) in cases {
            assert!(!fields.is_empty());
            assert_eq!(params(&doc, method, path, "query"), fields, "{method} {path}: query parameters differ");
        }
    }

    /// Every `pub const X: &str = "X";` inside a `mod codes { ... }` of `src/api`.
    fn codes_in_source() -> BTreeSet<String> {
        fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).expect("read src/api").flatten() {
                let p = e.path();
                if p.is_dir() {
                    files(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut paths = Vec::new();
        files(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api"), &mut paths);
        let mut codes = BTreeSet::new();
        for p in paths {
            let text = std::fs::read_to_string(&p).expect("read source");
            let mut inside = None;
            for line in text.lines() {
                let indent = line.len() - line.trim_start().len();
                match inside {
                    None if line.trim_start().starts_with("pub mod codes {") => inside = Some(indent),
                    Some(i) if line.trim() == "}" && indent == i => inside = None,
                    Some(_) => {
                        if let Some(rest) = line.trim().strip_prefix("pub const ") {
                            let value = rest.split('"').nth(1).unwrap_or_else(|| panic!("{p:?}: {line}"));
                            codes.insert(value.to_string());
                        }
                    }
                    None => {}
                }
            }
        }
        codes
    }

    #[test]
    fn every_error_code_is_described_and_no_other() {
        let doc = doc();
        let described: BTreeSet<String> = doc["components"]["schemas"]["ErrorCode"]["enum"]
            .as_array()
            .expect("ErrorCode enum")
            .iter()
            .map(|v| v.as_str().expect("a code").to_string())
            .collect();
        let defined = codes_in_source();
        assert!(defined.contains(super::super::codes::INVALID_JSON) && defined.contains("INVALID_SCHEDULE"));
        let missing: Vec<_> = defined.difference(&described).collect();
        let extra: Vec<_> = described.difference(&defined).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "ErrorCode of openapi/openapi.json and the codes of src/api differ: not described {missing:?}; \
             described but not defined {extra:?}"
        );
        // Every code is answered somewhere the description says (or by the console).
        let text = doc["paths"].to_string() + &doc["components"]["responses"].to_string();
        for code in &defined {
            let console_only = doc["components"]["schemas"]["ErrorCode"]["description"].as_str().is_some_and(|d| {
                d.lines().any(|l| l.starts_with(&format!("- `{code}`")) && l.contains("console only"))
            });
            let general = ["NO_SUCH_ROUTE", "METHOD_NOT_ALLOWED", "METRICS_DISABLED", "TOO_MANY_CONNECTIONS"]
                .contains(&code.as_str());
            assert!(
                console_only || general || text.contains(&format!("`{code}`")),
                "error code {code} is in ErrorCode but no route's responses name it"
            );
        }
    }

    #[test]
    fn every_route_says_how_it_is_authenticated() {
        let doc = doc();
        for r in ROUTES {
            let op = operation(&doc, &r.method.as_str().to_lowercase(), r.path).expect("described");
            let open = op["security"].as_array().is_some_and(|s| s.is_empty());
            assert_eq!(
                open,
                r.guard == super::super::Guard::Open,
                "{} {}: security differs from its guard",
                r.method,
                r.path
            );
            if !open {
                assert!(op["responses"].get("401").is_some(), "{} {}: no 401 described", r.method, r.path);
            }
        }
    }
}
