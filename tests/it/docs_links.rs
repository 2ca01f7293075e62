//! Every relative link in README.md and docs/ points at a file that exists, and every
//! `#anchor` into a Markdown file names one of its headings (GitHub's slugs).

use std::path::{Path, PathBuf};

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read docs/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The link targets of `[text](target)` outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        let outside_code: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = outside_code.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].trim().to_string());
            rest = &after[end..];
        }
    }
    found
}

/// GitHub's heading anchor: lower case, spaces to '-', punctuation other than '-' and '_' dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut in_block = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if !in_block && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

fn broken_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("read markdown");
    let dir = file.parent().expect("file has a folder");
    let mut broken = Vec::new();
    for link in links(&text) {
        if link.contains("://") || link.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match link.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (link.as_str(), None),
        };
        let target = if path.is_empty() { file.to_path_buf() } else { dir.join(path) };
        if !target.exists() {
            broken.push(format!("{}: {link} (no such file)", file.display()));
            continue;
        }
        if let Some(anchor) = anchor {
            let is_md = target.extension().is_some_and(|e| e == "md");
            let body = std::fs::read_to_string(&target).unwrap_or_default();
            if is_md && !anchors(&body).iter().any(|a| a == anchor) {
                broken.push(format!("{}: {link} (no such heading)", file.display()));
            }
        }
    }
    broken
}

#[test]
fn every_doc_link_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files);
    let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(broken.is_empty(), "broken links (fix the path or the heading):\n{}", broken.join("\n"));
}

#[test]
fn the_checker_sees_a_broken_link() {
    let dir = std::env::temp_dir().join(format!("fairway-doclinks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a.md");
    std::fs::write(&file, "# Title\n[ok](#title) [bad](missing.md) [badanchor](#nope) `[code](x.md)`\n").unwrap();
    let broken = broken_links(&file);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(broken.len(), 2, "{broken:?}");
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 320, "README.md has {lines} lines: move reference material to docs/");
}
