//! The house's edges hold: only `src/kafka/` names the rdkafka crate and only `src/store/`
//! names the scylla crate. Every other module reaches the broker and the database through
//! those two (`kafka::Reader`, `kafka::partition_ends`, `store::Store`...), so a reader
//! finds all broker and database I/O in two places. And `worker/`'s files import each other
//! without a cycle: a job's route (`worker::route`) calls forward only.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Lines of `text` (1-based numbers) that use crate `name` as a path (`name::...`,
/// `use name`, `extern crate name`); comments do not count.
fn uses_of(text: &str, name: &str) -> Vec<usize> {
    let path = format!("{name}::");
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("").trim();
        if code.is_empty() {
            continue;
        }
        let named_as_path = code.match_indices(&path).any(|(at, _)| {
            let before = code[..at].chars().next_back();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.' || c == '"')
        });
        let imported = code.starts_with(&format!("use {name}"))
            || code.starts_with(&format!("pub use {name}"))
            || code.starts_with(&format!("extern crate {name}"));
        if named_as_path || imported {
            found.push(i + 1);
        }
    }
    found
}

#[test]
fn the_detector_sees_paths_and_imports_and_ignores_comments_and_fields() {
    let text = "use rdkafka::Offset;\n// rdkafka::x in a comment\nlet x = cfg.scylla.keyspace;\n\
                let c: Arc<rdkafka::consumer::StreamConsumer> = todo!();\npub use scylla;\n";
    assert_eq!(uses_of(text, "rdkafka"), vec![1, 4]);
    assert_eq!(uses_of(text, "scylla"), vec![5]);
}

#[test]
fn rdkafka_only_in_kafka_and_scylla_only_in_store() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut outside = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(f).unwrap();
        for (krate, edge) in [("rdkafka", "kafka/"), ("scylla", "store/")] {
            if rel.starts_with(edge) {
                continue;
            }
            for line in uses_of(&text, krate) {
                outside.push(format!("src/{rel}:{line} names {krate} (only src/{edge} may; add what you need there)"));
            }
        }
    }
    assert!(files.len() > 50, "found only {} files under src/", files.len());
    assert!(outside.is_empty(), "crate used outside its edge:\n{}", outside.join("\n"));
}

/// The `worker/` modules a file of `worker/` imports (`use super::x`, `use super::{x, y}`).
fn worker_imports(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| l.starts_with("use super::")) {
        let rest = &line["use super::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(list) => list.trim_end_matches("};").split(',').collect(),
            None => vec![rest],
        };
        for n in names {
            let module = n.trim().split("::").next().unwrap_or("").trim_end_matches(';');
            if module.chars().next().is_some_and(|c| c.is_ascii_lowercase()) && module != "self" {
                out.push(module.to_string());
            }
        }
    }
    out
}

#[test]
fn worker_modules_import_each_other_without_a_cycle() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/worker");
    let mut graph = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_string) else { continue };
        if name == "mod" || path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        // Only the module's own code: its tests may import anything.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        graph.insert(name, worker_imports(code));
    }
    assert!(graph.len() > 10, "read only {} files of src/worker", graph.len());
    // Depth-first search for a back edge.
    fn visit<'a>(
        n: &'a str,
        graph: &'a std::collections::BTreeMap<String, Vec<String>>,
        path: &mut Vec<&'a str>,
        done: &mut std::collections::HashSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| *p == n) {
            return Some(path[i..].iter().map(|s| s.to_string()).chain([n.to_string()]).collect());
        }
        if !done.insert(n) {
            return None;
        }
        path.push(n);
        for m in graph.get(n).into_iter().flatten() {
            if let Some(cycle) = visit(m, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = std::collections::HashSet::new();
    for n in graph.keys() {
        if let Some(cycle) = visit(n, &graph, &mut Vec::new(), &mut done) {
            panic!("worker/ modules import each other in a cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_import_reader_sees_single_and_grouped_imports() {
    let text = "use super::outcome::{self, update};\nuse super::{check, Shared};\nuse super::route::Origin;\n";
    assert_eq!(worker_imports(text), vec!["outcome", "check", "route"]);
}
