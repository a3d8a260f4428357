//! The library's one error type.
//!
//! Invariant: every error a user's input can cause is a value of [`Error`], never a panic; errors
//! about a place in a file name it as `FILE:LINE:COL` and show the line with a caret.

use std::fmt;

/// A message about a place in a source file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
    pub message: String,
    /// The text of the line, shown under the message with a caret under the column.
    pub source_line: Option<String>,
}

impl Diagnostic {
    /// A diagnostic at `line:col` of `source` (the whole file text).
    pub fn at(file: &str, source: &str, line: usize, col: usize, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            file: file.to_string(),
            line,
            col,
            message: message.into(),
            source_line: source.lines().nth(line.saturating_sub(1)).map(str::to_string),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.message)?;
        if let Some(src) = &self.source_line {
            let gutter = self.line.to_string();
            let pad = " ".repeat(gutter.len());
            let caret_pad: String =
                src.chars().take(self.col.saturating_sub(1)).map(|c| if c == '\t' { '\t' } else { ' ' }).collect();
            write!(f, "\n{pad} |\n{gutter} | {src}\n{pad} | {caret_pad}^")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong in eqfuse.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad user input at a known place (program, rules, JSON).
    #[error("{0}")]
    Input(Box<Diagnostic>),
    /// Bad user input with no single place (an op and its shapes, a missing file's contents).
    #[error("{0}")]
    Invalid(String),
    /// A command-line option that is wrong for its command or for the program it names (exit
    /// status 2, as clap's own usage errors).
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A GPU command was asked for and no usable GPU is present.
    #[error("no usable GPU: {0}")]
    NoGpu(String),
    /// A CUDA call failed; the message names the kernel or call.
    #[error("CUDA error in {context}: {message}")]
    Cuda { context: String, message: String },
}

impl Error {
    pub fn input(d: Diagnostic) -> Error {
        Error::Input(Box::new(d))
    }
    pub fn io(path: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { path: path.into(), source }
    }
    /// The process exit status this error maps to (DESIGN.md §5).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            Error::NoGpu(_) => 3,
            _ => 1,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caret_under_column() {
        let d = Diagnostic::at("p.eqf", "a\ny = x +* 2\n", 2, 9, "expected an expression");
        assert_eq!(d.to_string(), "p.eqf:2:9: expected an expression\n  |\n2 | y = x +* 2\n  |         ^");
    }
}
