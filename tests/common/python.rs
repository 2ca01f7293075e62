//! Python tools for tests (manifest validation, the Python client's pytest suite): one
//! virtual environment per purpose under `target/python/`, made on first use with pinned
//! packages from PyPI and reused while the pins stay the same. Nothing is installed
//! globally.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The virtual environment `name` with `packages` (pip requirement strings) installed;
/// its directory. Panics with what to do when python3 or PyPI is not reachable.
pub fn venv(name: &str, packages: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("python");
    let dir = root.join(name);
    let marker = dir.join("fairway-packages.txt");
    let want = packages.join("\n");
    if std::fs::read_to_string(&marker).is_ok_and(|have| have == want) {
        return dir;
    }
    std::fs::create_dir_all(&root).expect("create target/python");
    // Built beside, then renamed: a half-made environment is never taken for a ready one.
    let building = root.join(format!("{name}.building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&building),
        "python3 -m venv (install python3 and python3-venv)",
    );
    let pip = building.join("bin").join("pip");
    run(
        Command::new("timeout")
            .arg("600")
            .arg(&pip)
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(packages),
        "pip install from PyPI (is https://pypi.org reachable?)",
    );
    std::fs::write(building.join("fairway-packages.txt"), &want).expect("write the venv marker");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&building, &dir).expect("move the new venv into place");
    // A venv's scripts name their interpreter by absolute path: point them at the new place.
    for entry in std::fs::read_dir(dir.join("bin")).expect("venv bin").flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
        if text.contains(building.to_str().unwrap()) {
            std::fs::write(entry.path(), text.replace(building.to_str().unwrap(), dir.to_str().unwrap())).unwrap();
        }
    }
    dir
}

/// The Python client's environment (`clients/python`'s dependencies and pytest, pinned).
pub fn client_venv() -> PathBuf {
    venv("client", &["fastavro==1.13.1", "confluent-kafka==2.16.1", "pytest==9.2.0", "setuptools>=61", "wheel"])
}

/// Runs `cmd` to completion; panics with `what` and its output when it fails.
pub fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}
