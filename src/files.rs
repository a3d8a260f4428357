//! Reading the files a user names (programs, graphs, models, profiles, `.npy` inputs): a regular
//! file or a pipe, or a link to one. A folder or a device (`/dev/zero`, which would never end) is
//! an error naming it, before anything is read.

use crate::error::{Error, Result};

/// The bytes of the file at `path`, which must be a regular file or a pipe (`<(...)`), or a link
/// to one: a folder or a device (`/dev/zero`, which would never end) is an error naming it.
pub fn read_file(path: &str) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !is_readable_kind(&meta) {
        let what = if meta.is_dir() { "a folder" } else { "a device or other special file" };
        return Err(Error::Invalid(format!("{path}: is {what}, not a file")));
    }
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

/// A regular file or a pipe: what reading to the end makes sense of.
pub fn is_readable_kind(meta: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        meta.is_file() || meta.file_type().is_fifo()
    }
    #[cfg(not(unix))]
    {
        meta.is_file()
    }
}
