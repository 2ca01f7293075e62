//! HTML of the console: escaping, the page frame (navigation, who is logged in, the CSRF
//! token for the page's script), the login form and error pages.

use super::session::Viewer;
use crate::api::ApiError;
use crate::model::Millis;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use std::fmt::Write as _;

/// `s` escaped for HTML text and attribute values.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` escaped for a URL query value.
pub(super) fn url(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A UTC time (epoch ms) as `YYYY-MM-DD HH:MM:SS.mmm`.
pub(super) fn time(ms: Millis) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string().replace('T', " ").trim_end_matches('Z').to_string()
}

/// A duration in ms as `1.2 s`, `3 min`, ...
pub(super) fn age(ms: Millis) -> String {
    match ms {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms < 120_000 => format!("{:.1} s", ms as f64 / 1000.0),
        ms if ms < 7_200_000 => format!("{} min", ms / 60_000),
        ms => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}

const PAGES: [(&str, &str); 5] = [
    ("overview", "/console"),
    ("tenants", "/console/tenants"),
    ("jobs", "/console/jobs"),
    ("schedules", "/console/schedules"),
    ("dlq", "/console/dlq"),
];

/// A whole page: the frame around `body`, `active` naming the navigation entry.
pub(super) fn page(v: &Viewer, active: &str, title: &str, body: &str) -> Response {
    let mut nav = String::new();
    for (name, href) in PAGES {
        let class = if name == active { " class=\"active\"" } else { "" };
        let label = if name == "dlq" { "DLQ & retries".to_string() } else { capitalised(name) };
        let _ = write!(nav, "<a href=\"{href}\"{class} id=\"nav-{name}\">{label}</a>");
    }
    let who = match v.tenant() {
        Some(t) => format!("tenant <b id=\"who\">{}</b>", esc(t)),
        None => "<b id=\"who\">admin</b>".to_string(),
    };
    let logout = if v.csrf.is_some() { "<button id=\"logout\" class=\"link\">log out</button>" } else { "" };
    let csrf = esc(v.csrf.as_deref().unwrap_or("-"));
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title} · fairway</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><meta name=\"csrf\" content=\"{csrf}\">\
         <link rel=\"stylesheet\" href=\"/console/assets/console.css\"></head><body data-page=\"{active}\">\
         <header><span class=\"brand\">fairway</span><nav>{nav}</nav><span class=\"who\">{who} {logout}</span></header>\
         <main><h1>{title}</h1>{body}</main><script src=\"/console/assets/console.js\"></script></body></html>",
        title = esc(title),
    ))
    .into_response()
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

pub(super) fn login(error: Option<&str>, status: StatusCode) -> Response {
    let error = error.map(|e| format!("<p class=\"error\" id=\"login-error\">{}</p>", esc(e))).unwrap_or_default();
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Log in · fairway</title>\
         <link rel=\"stylesheet\" href=\"/console/assets/console.css\"></head><body class=\"login\"><main>\
         <h1>fairway console</h1>{error}<form method=\"post\" action=\"/console/login\">\
         <label>API key <input type=\"password\" name=\"key\" id=\"key\" autocomplete=\"off\" required></label>\
         <button type=\"submit\" id=\"login\">Log in</button></form>\
         <p class=\"hint\">An admin key sees everything; a tenant key sees its tenant and replays its own dead letters. \
         Keys come from <code>fairway keys create</code>.</p></main></body></html>"
    );
    (status, Html(body)).into_response()
}

pub(super) fn error_page(e: &ApiError) -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Error · fairway</title>\
         <link rel=\"stylesheet\" href=\"/console/assets/console.css\"></head><body><main><h1>{}</h1>\
         <p class=\"error\">{}</p><p><a href=\"/console\">back to the console</a></p></main></body></html>",
        e.status,
        esc(&e.message)
    );
    (e.status, Html(body)).into_response()
}

/// A `<table>` with a header row; `rows` are already rendered `<tr>`s.
pub(super) fn table(id: &str, head: &[&str], rows: &str) -> String {
    let th: String = head.iter().map(|h| format!("<th>{h}</th>")).collect();
    format!("<table id=\"{id}\"><thead><tr>{th}</tr></thead><tbody>{rows}</tbody></table>")
}

/// One `<tr>` of already escaped cells.
pub(super) fn row(cells: &[String]) -> String {
    let td: String = cells.iter().map(|c| format!("<td>{c}</td>")).collect();
    format!("<tr>{td}</tr>")
}

/// A text input of a filter form, keeping its value.
pub(super) fn input(name: &str, label: &str, value: Option<&str>, placeholder: &str) -> String {
    format!(
        "<label>{label} <input name=\"{name}\" id=\"f-{name}\" value=\"{}\" placeholder=\"{}\"></label>",
        esc(value.unwrap_or("")),
        esc(placeholder)
    )
}

/// A `<select>` keeping its value; the first option is "any" (empty).
pub(super) fn select(name: &str, label: &str, value: Option<&str>, options: &[&str]) -> String {
    let mut s = format!("<label>{label} <select name=\"{name}\" id=\"f-{name}\"><option value=\"\">any</option>");
    for o in options {
        let sel = if value == Some(*o) { " selected" } else { "" };
        let _ = write!(s, "<option{sel}>{}</option>", esc(o));
    }
    s.push_str("</select></label>");
    s
}

/// A time filter: `1h` (that long ago) or an RFC 3339 time (`2026-11-23T14:00:00Z`).
pub(super) fn parse_since(field: &'static str, s: &str, now: Millis) -> Result<Millis, ApiError> {
    let s = s.trim();
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, crate::api::codes::INVALID_QUERY, m);
    if let Ok(d) = humantime::parse_duration(s) {
        return crate::core::bounds::ago(field, now, d).map_err(|e| bad(e.to_string()));
    }
    let at = humantime::parse_rfc3339_weak(s)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .ok_or_else(|| {
            bad(format!(
                "`{field}`: time {s:?} is neither a duration ago (e.g. 30m, 2h) nor a time like 2026-11-23T14:00:00Z"
            ))
        })?;
    let ms = i64::try_from(at.as_millis()).unwrap_or(i64::MAX);
    crate::core::bounds::instant(field, ms).map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_urls() {
        assert_eq!(esc("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
        assert_eq!(url("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn times_read_as_ago_or_absolute() {
        assert_eq!(parse_since("since", "1h", 10_000_000).unwrap(), 10_000_000 - 3_600_000);
        assert_eq!(parse_since("since", "1970-01-01T00:00:01Z", 0).unwrap(), 1_000);
        assert!(parse_since("since", "yesterday-ish", 0).is_err());
        // Durations and times past what an instant holds are refused, naming the field.
        for s in ["1000000000years", "2h", "300000years"] {
            let e = parse_since("until", s, 1_000).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains("`until`") && e.message.contains("9999-12-31"), "{s}: {}", e.message);
        }
        assert_eq!(time(1_000), "1970-01-01 00:00:01.000");
        assert_eq!(age(1_500), "1.5 s");
    }
}
