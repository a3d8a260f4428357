//! NVRTC: finding the runtime compiler and compiling generated CUDA to PTX, cached on disk.
//!
//! `cudarc` loads `libnvrtc` by name through the dynamic loader (so `LD_LIBRARY_PATH` decides)
//! and panics when it is absent. [`available`] checks first, and when the loader cannot find
//! the library it opens `libnvrtc-builtins` and `libnvrtc` by path from a known folder
//! (`$EQFUSE_NVRTC_DIR`, the repository's `.nvrtc/` that `.ci/install-nvrtc` fills, the CUDA
//! toolkit's `lib64`); once open, the loader matches them by soname when `cudarc` asks.
//! Invariants: nothing here needs a GPU; a missing library is an error value, never a panic;
//! the cache key covers the source, the options and the NVRTC version, so a cached PTX is
//! always what compiling would give.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use crate::error::{Error, Result};

/// The architecture generated kernels are compiled for unless the device says otherwise.
pub const DEFAULT_ARCH: &str = "sm_90";

/// Folders searched for `libnvrtc.so.13` when the dynamic loader does not find it.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("EQFUSE_NVRTC_DIR") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(PathBuf::from(".nvrtc"));
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(".nvrtc"));
    if let Some(d) = std::env::var_os("CUDA_PATH") {
        dirs.push(Path::new(&d).join("lib64"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    dirs
}

/// Opens the NVRTC libraries in `dir` by path and keeps them open for the process.
fn preload(dir: &Path) -> bool {
    let lib = dir.join("libnvrtc.so.13");
    if !lib.is_file() {
        return false;
    }
    for name in ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"] {
        let p = dir.join(name);
        // SAFETY: loading NVRTC runs no initialisers with preconditions; the library stays
        // loaded for the life of the process (it is never unloaded), as cudarc expects.
        match unsafe { libloading::Library::new(&p) } {
            Ok(l) => std::mem::forget(l),
            Err(_) if name.starts_with("libnvrtc-builtins") => {}
            Err(_) => return false,
        }
    }
    true
}

/// The NVRTC version, or why NVRTC cannot be used. Checked once per process.
pub fn available() -> std::result::Result<(i32, i32), String> {
    static STATE: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only tries to open the library by name.
            let mut found = unsafe { sys::is_culib_present() };
            if !found {
                let dirs = search_dirs();
                found = dirs.iter().any(|d| preload(d)) && unsafe { sys::is_culib_present() };
                if !found {
                    let tried: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
                    return Err(format!(
                        "libnvrtc.so.13 is not on the loader path (LD_LIBRARY_PATH) nor in {}; run .ci/install-nvrtc",
                        tried.join(", ")
                    ));
                }
            }
            let (mut major, mut minor) = (0, 0);
            // SAFETY: the library is loaded; nvrtcVersion writes two ints.
            let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(format!("nvrtcVersion failed: {r:?}"));
            }
            Ok((major, minor))
        })
        .clone()
}

/// A compiled kernel: its PTX and the compiler's log (warnings).
#[derive(Clone, Debug)]
pub struct Compiled {
    pub ptx: Vec<u8>,
    pub log: String,
    /// Whether the PTX came from the disk cache.
    pub cached: bool,
}

fn nvrtc_err(context: &str, e: impl std::fmt::Debug) -> Error {
    Error::Cuda { context: context.to_string(), message: format!("{e:?}") }
}

/// Compiles `source` (named `name` in messages) for `arch` (`sm_90`) with extra `options`.
pub fn compile(source: &str, name: &str, arch: &str, options: &[String]) -> Result<Compiled> {
    available().map_err(Error::NoGpu)?;
    let context = format!("NVRTC compile of {name}");
    let src = CString::new(source).map_err(|e| nvrtc_err(&context, e))?;
    let cname = CString::new(name).map_err(|e| nvrtc_err(&context, e))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| nvrtc_err(&context, e))?;
    let mut opts = vec![format!("--gpu-architecture={arch}")];
    opts.extend(options.iter().cloned());
    // SAFETY: `prog` is a live program; it is destroyed below on every path.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let log = unsafe { result::get_program_log(prog) }.map(|l| c_chars(&l)).unwrap_or_default();
    let ptx = match compiled {
        Ok(()) => unsafe { result::get_ptx(prog) }.map(|p| c_chars(&p).into_bytes()),
        Err(e) => Err(e),
    };
    let _ = unsafe { result::destroy_program(prog) };
    match ptx {
        Ok(ptx) => Ok(Compiled { ptx, log, cached: false }),
        Err(e) => Err(Error::Cuda { context, message: format!("{e:?}\n{log}") }),
    }
}

fn c_chars(v: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = v.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// FNV-1a, 64 bits: the cache key's hash (stable across runs and Rust versions).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(&[0u8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Where compiled PTX is kept: `$EQFUSE_CACHE_DIR`, else `$XDG_CACHE_HOME/eqfuse`, else
/// `~/.cache/eqfuse`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("EQFUSE_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Path::new(&d).join("eqfuse");
    }
    match std::env::var_os("HOME") {
        Some(h) => Path::new(&h).join(".cache").join("eqfuse"),
        None => std::env::temp_dir().join("eqfuse-cache"),
    }
}

/// As [`compile`], through the disk cache (a cache that cannot be read or written is skipped).
pub fn compile_cached(source: &str, name: &str, arch: &str) -> Result<Compiled> {
    let (major, minor) = available().map_err(Error::NoGpu)?;
    let version = format!("{major}.{minor}");
    let key = fnv1a(&[source.as_bytes(), arch.as_bytes(), version.as_bytes()]);
    let path = cache_dir().join(format!("{name}-{arch}-{key:016x}.ptx"));
    if let Ok(ptx) = std::fs::read(&path) {
        return Ok(Compiled { ptx, log: String::new(), cached: true });
    }
    let c = compile(source, name, arch, &[])?;
    if std::fs::create_dir_all(cache_dir()).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &c.ptx).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_separates_parts() {
        assert_eq!(fnv1a(&[b""]), 0xaf63_bd4c_8601_b7df);
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }
}
