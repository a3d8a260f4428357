//! The library's one error type.
//!
//! Invariant: every error a user's input can cause is a value of [`Error`], never a panic; errors
//! about a place in a file name it as `FILE:LINE:COL` and show the line with a caret.

use std::fmt;

/// Characters of a long source line shown around a diagnostic's column.
const WINDOW: usize = 80;

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
            // A long line (a JSON file on one line) shows a window around the column.
            let chars: Vec<char> = src.chars().collect();
            let col = self.col.saturating_sub(1).min(chars.len());
            let (from, to) = if chars.len() > 2 * WINDOW {
                let from = col.saturating_sub(WINDOW / 2).min(chars.len() - WINDOW);
                (from, from + WINDOW)
            } else {
                (0, chars.len())
            };
            let shown: String = chars[from..to].iter().collect();
            let (before, after) = (if from > 0 { "..." } else { "" }, if to < chars.len() { "..." } else { "" });
            let caret_pad: String = std::iter::repeat_n(' ', before.len())
                .chain(chars[from..col].iter().map(|&c| if c == '\t' { '\t' } else { ' ' }))
                .collect();
            write!(f, "\n{pad} |\n{gutter} | {before}{shown}{after}\n{pad} | {caret_pad}^")?;
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

    #[test]
    fn long_lines_show_a_window_around_the_column() {
        let line = format!("{}X{}", "a".repeat(500), "b".repeat(500));
        let shown = Diagnostic::at("p.json", &line, 1, 501, "here").to_string();
        let lines: Vec<&str> = shown.lines().collect();
        assert!(lines[2].len() < 100 && lines[2].contains("...a") && lines[2].ends_with("b..."), "{shown}");
        let caret = lines[3].find('^').unwrap();
        assert_eq!(&lines[2][caret..caret + 1], "X", "{shown}");
        // Near either end there is one ellipsis.
        let start = Diagnostic::at("p.json", &line, 1, 3, "here").to_string();
        assert!(start.lines().nth(2).unwrap().starts_with("1 | aaa") && start.contains("a...\n"), "{start}");
        let end = Diagnostic::at("p.json", &line, 1, 1001, "here").to_string();
        let lines: Vec<&str> = end.lines().collect();
        assert!(lines[2].ends_with("bbb"), "{end}");
        assert_eq!(lines[3].find('^').unwrap(), lines[2].len() - 1, "{end}");
    }
}
