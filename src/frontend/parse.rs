//! The `.eqf` front end (specified in docs/language.md) and the loader that picks a front end by file name.
//!
//! Text goes through three stages, one file each: `lex` (characters to tokens), `syntax`
//! (tokens to statements, a Pratt parser) and `lower` (statements to a typed [`Program`]).
//! Invariant: any input text gives either a well-typed program or one error naming
//! `FILE:LINE:COL` of the offending token; never a panic.

mod lex;
mod lower;
mod syntax;

use std::io::Read;

use crate::error::{Diagnostic, Error, Result};
use crate::files::read_file;
use crate::ir::lang::is_identifier;
use crate::ir::program::{Program, MAX_ELEMENTS};

/// A 1-based line and column (in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pos {
    line: usize,
    col: usize,
}

/// An error at a place in the text, before the file name is attached.
#[derive(Debug)]
struct PError {
    pos: Pos,
    msg: String,
}

impl PError {
    fn new(pos: Pos, msg: impl Into<String>) -> PError {
        PError { pos, msg: msg.into() }
    }
}

/// Parses and type-checks an `.eqf` program.
///
/// `file` names the program in errors and becomes [`Program::source`]; `overrides` are
/// `--dim NAME=VALUE` pairs replacing declared sizes; naming a dim twice, or one the program does
/// not declare, is an error ([`Error::Usage`]).
///
/// ```
/// let p = eqfuse::parse_program("t.eqf", "dim N = 8\ninput x: f32[N]\ny = exp(x) / N\noutput y\n", &[]).unwrap();
/// assert_eq!(p.ty(p.outputs[0].id).unwrap().shape, vec![8]);
/// ```
pub fn parse_program(file: &str, source: &str, overrides: &[(String, usize)]) -> Result<Program> {
    check_overrides(overrides)?;
    let prog = build(file, source, overrides).map_err(|e| diagnostic(file, source, e))?;
    if let Some((name, value)) = overrides.iter().find(|(n, _)| prog.dim(n).is_none()) {
        let declared: Vec<&str> = prog.dims.iter().map(|(n, _)| n.as_str()).collect();
        let known = if declared.is_empty() { "none".to_string() } else { declared.join(", ") };
        return Err(Error::Usage(format!(
            "--dim {name}={value}: {file} declares no dim `{name}` (it declares {known})"
        )));
    }
    Ok(prog)
}

fn build(file: &str, source: &str, overrides: &[(String, usize)]) -> Result<Program, PError> {
    let mut parser = syntax::Parser::new(lex::lex(source)?);
    let mut builder = lower::Builder::new(file, overrides);
    while let Some(stmt) = parser.statement()? {
        builder.statement(stmt)?;
    }
    if builder.statements == 0 {
        return Err(PError::new(Pos { line: 1, col: 1 }, "the program is empty (no statements)"));
    }
    if builder.outputs == 0 {
        return Err(PError::new(end_of(source), "the program has no `output` statement naming its results"));
    }
    Ok(builder.prog)
}

/// The position just past the last character, for errors about something missing.
fn end_of(source: &str) -> Pos {
    match source.rsplit_once('\n') {
        Some((before, "")) => Pos { line: before.matches('\n').count() + 2, col: 1 },
        Some((before, last)) => Pos { line: before.matches('\n').count() + 2, col: last.chars().count() + 1 },
        None => Pos { line: 1, col: source.chars().count() + 1 },
    }
}

fn diagnostic(file: &str, source: &str, e: PError) -> Error {
    Error::input(Diagnostic::at(file, source, e.pos.line, e.pos.col, e.msg))
}

/// Every override well formed, and no dim named twice (`--dim R=8 --dim R=16`).
pub(crate) fn check_overrides(overrides: &[(String, usize)]) -> Result<()> {
    for (i, (name, value)) in overrides.iter().enumerate() {
        check_override(name, *value).map_err(Error::Usage)?;
        if let Some((_, first)) = overrides[..i].iter().find(|(n, _)| n == name) {
            return Err(Error::Usage(format!("--dim {name} is given twice ({name}={first} and {name}={value})")));
        }
    }
    Ok(())
}

pub(crate) fn check_override(name: &str, value: usize) -> Result<(), String> {
    if !is_identifier(name) {
        return Err(format!("--dim {name}={value}: `{name}` is not a dim name"));
    }
    if value == 0 || value > MAX_ELEMENTS {
        return Err(format!("--dim {name}={value}: a size must be between 1 and 2^48"));
    }
    Ok(())
}

/// Parses a command-line `--dim NAME=VALUE`.
pub fn parse_dim_override(s: &str) -> Result<(String, usize), String> {
    let Some((name, value)) = s.split_once('=') else {
        return Err(format!("expected NAME=VALUE, got `{s}`"));
    };
    let (name, value) = (name.trim(), value.trim());
    let v = match value.parse::<usize>() {
        Ok(v) => v,
        Err(_) => return Err(format!("--dim {s}: `{value}` is not a positive integer")),
    };
    check_override(name, v)?;
    Ok((name.to_string(), v))
}

/// Reads and parses a program, choosing the front end by file name: `.eqf` text, a `.json`
/// graph, an `.onnx` model (`--dim` sizes its symbolic dims), or `-` for standard input: a JSON
/// graph when its first non-blank character is `{`, else `.eqf` text.
pub fn load_program(path: &str, overrides: &[(String, usize)]) -> Result<Program> {
    if path == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|e| Error::io("<stdin>", e))?;
        return match text.trim_start().starts_with('{') {
            true if overrides.is_empty() => crate::frontend::json::program_from_json("<stdin>", &text),
            true => Err(Error::Usage("<stdin>: --dim applies to .eqf programs; a JSON graph has fixed shapes".into())),
            false => parse_program("<stdin>", &text, overrides),
        };
    }
    let ext = std::path::Path::new(path).extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "eqf" => parse_program(path, &read(path)?, overrides),
        "json" if overrides.is_empty() => crate::frontend::json::program_from_json(path, &read(path)?),
        "json" => Err(Error::Usage(format!("{path}: --dim applies to .eqf programs; a JSON graph has fixed shapes"))),
        "onnx" => crate::frontend::onnx::program_from_onnx_file(path, overrides),
        _ => Err(Error::Invalid(format!("{path}: unknown program format; expected .eqf, .json, .onnx or - (stdin)"))),
    }
}

fn read(path: &str) -> Result<String> {
    String::from_utf8(read_file(path)?).map_err(|_| Error::Invalid(format!("{path}: not UTF-8 text")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_positions() {
        assert_eq!(end_of(""), Pos { line: 1, col: 1 });
        assert_eq!(end_of("ab"), Pos { line: 1, col: 3 });
        assert_eq!(end_of("a\nb\n"), Pos { line: 3, col: 1 });
        assert_eq!(end_of("a\nbé"), Pos { line: 2, col: 3 });
    }

    #[test]
    fn overrides() {
        assert_eq!(parse_dim_override("R=16384"), Ok(("R".to_string(), 16384)));
        assert!(parse_dim_override("R").is_err());
        assert!(parse_dim_override("R=0").is_err());
        assert!(parse_dim_override("R=-3").is_err());
        assert!(parse_dim_override("1R=3").is_err());
        assert!(parse_dim_override("R=99999999999999999999999").is_err());
    }
}
