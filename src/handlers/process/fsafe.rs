//! What the worker (often root) writes into a directory an attempt's uid can write: the
//! pooled child's per-job directory and the checkpoint file handed to a child. Every step
//! goes through file descriptors and never follows a symbolic link, so a child (or a
//! stray of its uid) that swaps a name for a link, or creates the name first, cannot make
//! the worker write, chmod or chown anything outside that directory: the step fails
//! instead, and the attempt fails `dependency` with the reason.
//!
//! The directory a [`Dir`] is opened at must be reached through directories no other uid
//! can write (the sandbox root is root's, mode 0711); its own final component is not
//! followed if it is a link.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// An open directory, written through by name only with `*at` calls.
pub struct Dir {
    fd: OwnedFd,
}

fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

/// A single path component (no `/`, not `.` or `..`, no NUL), as a C string.
fn component(name: &str) -> io::Result<CString> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a single file name")));
    }
    CString::new(name.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a file name holds NUL"))
}

impl Dir {
    /// Opens `path` as a directory; a link there is refused, not followed.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Dir { fd: file.into() })
    }

    /// Makes the directory `name` inside, mode 0700, owned by this process (give it away
    /// with [`Dir::chown`] once its contents are written). An existing entry of that name
    /// is an error: nothing already there is reused.
    pub fn make_private(&self, name: &str) -> io::Result<Dir> {
        let c = component(name)?;
        // SAFETY: a valid directory fd and a NUL-terminated name; mkdirat reads both only.
        if unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let dir = Dir { fd: self.open_at(&c, flags, 0)? };
        // Swapped between the two calls for another directory (or a link, refused above)?
        let meta = dir.file()?.metadata()?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != me {
            return Err(refused(format!("{name} was replaced while it was being made")));
        }
        dir.file()?.set_permissions(std::fs::Permissions::from_mode(0o700))?;
        Ok(dir)
    }

    /// Writes the new file `name` (mode 0600), owned by `owner` if given. An existing entry
    /// of that name (a link, a file someone put there first) is refused, never written.
    pub fn write_new(&self, name: &str, bytes: &[u8], owner: Option<u32>) -> io::Result<()> {
        let c = component(name)?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let mut file = File::from(self.open_at(&c, flags, 0o600)?);
        file.write_all(bytes)?;
        if let Some(uid) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(uid))?;
        }
        Ok(())
    }

    /// Gives the directory itself to `uid` (through its descriptor, not its name).
    pub fn chown(&self, uid: u32) -> io::Result<()> {
        std::os::unix::fs::fchown(&self.fd, Some(uid), Some(uid))
    }

    fn open_at(&self, name: &CString, flags: i32, mode: libc::mode_t) -> io::Result<OwnedFd> {
        // SAFETY: a valid directory fd and a NUL-terminated name; the returned fd, if any,
        // is new and owned by nothing else.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), name.as_ptr(), flags, libc::c_uint::from(mode)) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by openat and is owned here alone.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn file(&self) -> io::Result<File> {
        Ok(File::from(self.fd.try_clone()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link put where the worker writes is refused, and the file it points at is
    /// unchanged; so is a file put there first.
    #[test]
    fn links_and_existing_names_are_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"precious").unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        let job = dir.make_private("job").unwrap();
        std::os::unix::fs::symlink(&outside, tmp.path().join("job/checkpoint")).unwrap();
        assert!(job.write_new("checkpoint", b"evil", None).is_err(), "a link is not followed");
        assert_eq!(std::fs::read(&outside).unwrap(), b"precious");
        std::fs::write(tmp.path().join("job/other"), b"theirs").unwrap();
        assert!(job.write_new("other", b"ours", None).is_err(), "an existing file is not reused");
        job.write_new("fresh", b"state", None).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("job/fresh")).unwrap(), b"state");
        let mode = std::fs::metadata(tmp.path().join("job/fresh")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A directory name that is a link, or exists already, is refused; names that are
    /// not one component are refused before any call.
    #[test]
    fn a_directory_is_made_fresh_and_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), tmp.path().join("link")).unwrap();
        assert!(Dir::open(&tmp.path().join("link")).is_err(), "open refuses a link");
        let dir = Dir::open(tmp.path()).unwrap();
        assert!(dir.make_private("link").is_err(), "an existing link is not reused");
        std::fs::create_dir(tmp.path().join("taken")).unwrap();
        assert!(dir.make_private("taken").is_err(), "an existing directory is not reused");
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert_eq!(dir.make_private(bad).err().map(|e| e.kind()), Some(io::ErrorKind::InvalidInput), "{bad:?}");
        }
        let made = dir.make_private("made").unwrap();
        made.write_new("f", b"1", None).unwrap();
        let mode = std::fs::metadata(tmp.path().join("made")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(std::fs::read_dir(elsewhere.path()).unwrap().next().is_none(), "nothing written through the link");
    }
}
