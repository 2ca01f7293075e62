//! The child's side of the control protocol, bounded: lines on fd 3 of at most
//! `CONTROL_LINE_MAX` bytes (a line without end is the attempt's `resource` failure, not
//! the worker's memory), and the checkpoint file read without following links, only if
//! it is a regular file of the attempt's uid, and never more than the checkpoint limit.

use crate::core::limits::CONTROL_LINE_MAX;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use tokio::io::AsyncReadExt;

/// A control line longer than `CONTROL_LINE_MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlong;

/// Lines of the control pipe, each at most `CONTROL_LINE_MAX` bytes.
pub struct Lines {
    pipe: tokio::net::unix::pipe::Receiver,
    buf: Vec<u8>,
}

impl Lines {
    pub fn new(pipe: tokio::net::unix::pipe::Receiver) -> Lines {
        Lines { pipe, buf: Vec::new() }
    }

    /// The next line (without its `\n`); None at the end of the pipe (a last line
    /// without `\n` is dropped). Cancel-safe: bytes read stay in the buffer.
    pub async fn next_line(&mut self) -> Result<Option<String>, Overlong> {
        let max = CONTROL_LINE_MAX.0 as usize;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(Some(String::from_utf8_lossy(&line[..i]).into_owned()));
            }
            if self.buf.len() > max {
                self.buf = Vec::new();
                return Err(Overlong);
            }
            let mut chunk = [0u8; 8192];
            match self.pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => return Ok(None),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

impl Lines {
    /// Exactly `n` bytes (a pooled job's output after its `result` line, `n` at most the
    /// output cap); None if the pipe ends first. Cancel-safe like `next_line`.
    pub async fn next_bytes(&mut self, n: usize) -> Option<Vec<u8>> {
        loop {
            if self.buf.len() >= n {
                return Some(self.buf.drain(..n).collect());
            }
            let mut chunk = [0u8; 8192];
            match self.pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
            }
        }
    }
}

/// The checkpoint file's bytes: a regular file (no symbolic link followed), owned by
/// the attempt's uid when it has one, at most `max` bytes (one more tells it is over).
pub fn read_checkpoint_file(path: &Path, uid: Option<u32>, max: u64) -> std::io::Result<Vec<u8>> {
    let refuse = |why: &str| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.to_string());
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(refuse("not a regular file"));
    }
    if uid.is_some_and(|u| meta.uid() != u) {
        return Err(refuse("not owned by the attempt's uid"));
    }
    let mut state = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(f, max + 1), &mut state)?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_a_line_without_end_is_overlong() {
        let (tx, rx) = tokio::net::unix::pipe::pipe().unwrap();
        let mut lines = Lines::new(rx);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut tx = tx;
            tx.write_all(b"heartbeat\nprogress 0.5\n").await.unwrap();
            let _ = tx.write_all(&vec![b'x'; 200 << 10]).await;
        });
        assert_eq!(lines.next_line().await, Ok(Some("heartbeat".into())));
        assert_eq!(lines.next_line().await, Ok(Some("progress 0.5".into())));
        assert_eq!(lines.next_line().await, Err(Overlong));
        drop(lines);
        let _ = writer.await;
    }

    #[test]
    fn a_checkpoint_file_that_is_a_link_is_refused() {
        let dir = std::env::temp_dir().join(format!("fairway-control-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("checkpoint");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        assert!(read_checkpoint_file(&link, None, 1 << 20).is_err(), "a link is not followed");
        std::fs::remove_file(&link).unwrap();
        std::fs::write(&link, b"7").unwrap();
        assert_eq!(read_checkpoint_file(&link, None, 1 << 20).unwrap(), b"7");
        assert!(read_checkpoint_file(&link, Some(4242), 1 << 20).is_err(), "another uid's file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
