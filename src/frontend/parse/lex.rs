//! The `.eqf` lexer: source text to tokens with 1-based line and character columns.
//!
//! Invariant: every character of the source is either part of a token, whitespace, a comment, or
//! the subject of an error at its own position; newlines are tokens, because a statement is one
//! line.

use super::{PError, Pos};

/// One token kind.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// A name: a letter or `_`, then letters, digits and `_`.
    Ident(String),
    /// A number literal, exactly as written; converted where its meaning is known.
    Number(String),
    /// An operator or punctuation mark, spelled as in [`PUNCT`].
    Punct(&'static str),
    Newline,
    Eof,
}

impl Tok {
    /// How an error message names this token.
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Number(s) => format!("number `{s}`"),
            Tok::Punct(p) => format!("`{p}`"),
            Tok::Newline => "end of line".to_string(),
            Tok::Eof => "end of file".to_string(),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Token {
    pub tok: Tok,
    pub pos: Pos,
}

/// Two-character marks come first so that `<=` is not lexed as `<` then `=`.
const PUNCT: &[&str] =
    &["<=", ">=", "==", "!=", "(", ")", "[", "]", ",", ":", "=", "+", "-", "*", "/", "@", "^", "<", ">"];

/// Splits `source` into tokens, ending with [`Tok::Eof`].
pub(super) fn lex(source: &str) -> Result<Vec<Token>, PError> {
    // Editors hide a byte-order mark, so columns are counted after it.
    let text = source.strip_prefix('\u{feff}').unwrap_or(source);
    let mut lexer = Lexer { chars: text.chars().collect(), i: 0, pos: Pos { line: 1, col: 1 }, out: vec![] };
    lexer.run()?;
    Ok(lexer.out)
}

struct Lexer {
    chars: Vec<char>,
    i: usize,
    pos: Pos,
    out: Vec<Token>,
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.i += 1;
        if c == '\n' {
            self.pos = Pos { line: self.pos.line + 1, col: 1 };
        } else {
            self.pos.col += 1;
        }
        Some(c)
    }

    fn push(&mut self, tok: Tok, pos: Pos) {
        self.out.push(Token { tok, pos });
    }

    fn run(&mut self) -> Result<(), PError> {
        while let Some(c) = self.peek(0) {
            let start = self.pos;
            match c {
                '\n' => {
                    self.bump();
                    self.push(Tok::Newline, start);
                }
                ' ' | '\t' | '\r' => {
                    self.bump();
                }
                '#' => self.skip_comment(),
                c if c.is_ascii_alphabetic() || c == '_' => self.ident(start),
                c if c.is_ascii_digit() => self.number(start)?,
                '.' if self.peek(1).is_some_and(|d| d.is_ascii_digit()) => self.number(start)?,
                _ => self.punct(start)?,
            }
        }
        self.push(Tok::Eof, self.pos);
        Ok(())
    }

    fn skip_comment(&mut self) {
        while self.peek(0).is_some_and(|c| c != '\n') {
            self.bump();
        }
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek(0).filter(|&c| f(c)) {
            s.push(c);
            self.bump();
        }
        s
    }

    fn ident(&mut self, start: Pos) {
        let s = self.take_while(|c| c.is_ascii_alphanumeric() || c == '_');
        self.push(Tok::Ident(s), start);
    }

    /// `12`, `1.5`, `.5`, `1.`, `1e-5`, `2.5E+3`. A letter, digit or dot right after a number is an
    /// error rather than a second token, so `2x` and `1.2.3` are reported, not misread.
    fn number(&mut self, start: Pos) -> Result<(), PError> {
        let mut s = self.take_while(|c| c.is_ascii_digit());
        if self.peek(0) == Some('.') {
            self.bump();
            s.push('.');
            s += &self.take_while(|c| c.is_ascii_digit());
        }
        if matches!(self.peek(0), Some('e' | 'E')) {
            let sign = matches!(self.peek(1), Some('+' | '-'));
            let digit_at = if sign { 2 } else { 1 };
            if !self.peek(digit_at).is_some_and(|c| c.is_ascii_digit()) {
                return Err(PError::new(self.pos, format!("the exponent of number `{s}` needs digits")));
            }
            for _ in 0..digit_at {
                s.extend(self.bump());
            }
            s += &self.take_while(|c| c.is_ascii_digit());
        }
        if let Some(c) = self.peek(0).filter(|&c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            return Err(PError::new(self.pos, format!("unexpected `{c}` right after number `{s}`")));
        }
        self.push(Tok::Number(s), start);
        Ok(())
    }

    fn punct(&mut self, start: Pos) -> Result<(), PError> {
        let (a, b) = (self.peek(0), self.peek(1));
        if (a, b) == (Some('*'), Some('*')) {
            return Err(PError::new(start, "`**` is not an operator; write `^` for a power"));
        }
        let two: String = [a, b].iter().flatten().collect();
        let found = PUNCT.iter().find(|p| two.starts_with(**p));
        let Some(&p) = found else {
            let c = a.unwrap_or(' ');
            let hint = if c == '!' { " (did you mean `!=`?)" } else { "" };
            return Err(PError::new(start, format!("unexpected character `{}`{hint}", c.escape_debug())));
        };
        for _ in 0..p.len() {
            self.bump();
        }
        self.push(Tok::Punct(p), start);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn numbers_and_marks() {
        assert_eq!(
            toks("y=1e-5<=.5# c\n"),
            vec![
                Tok::Ident("y".into()),
                Tok::Punct("="),
                Tok::Number("1e-5".into()),
                Tok::Punct("<="),
                Tok::Number(".5".into()),
                Tok::Newline,
                Tok::Eof
            ]
        );
    }

    #[test]
    fn positions_count_characters() {
        let t = lex("é").unwrap_err();
        assert_eq!((t.pos.line, t.pos.col), (1, 1));
        let t = lex("# é\n  x $").unwrap_err();
        assert_eq!((t.pos.line, t.pos.col), (2, 5));
        assert!(lex("2x").unwrap_err().msg.contains("right after number"));
        assert!(lex("1e+").unwrap_err().msg.contains("exponent"));
        assert!(lex("a ** b").unwrap_err().msg.contains("`^`"));
    }
}
