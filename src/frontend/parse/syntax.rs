//! The `.eqf` grammar: tokens to statements and expression trees (a Pratt parser).
//!
//! Nothing here knows names, types or the op table beyond operator spellings; meaning is given by
//! `lower`. Invariant: the parser recurses at most [`MAX_NESTING`] deep and every tree is at most
//! [`MAX_DEPTH`] deep, so that parsing, lowering and dropping a tree cannot overflow the stack
//! whatever the input (together they stay well under a megabyte of stack in a debug build).

use super::lex::{Tok, Token};
use super::{PError, Pos};
use crate::ir::lang::{Binary, Kind, OpCode, Unary};

/// Deepest nesting of parentheses, calls and prefix minus. A parser level costs kilobytes of stack
/// in a debug build; hand-written programs stay far below this.
pub(super) const MAX_NESTING: usize = 64;

/// Deepest expression tree, which long chains such as `a + b + c + ...` grow without nesting.
pub(super) const MAX_DEPTH: usize = 256;

/// An expression tree.
#[derive(Debug)]
pub(super) enum Ast {
    /// A number literal; `int` when written without `.` or exponent.
    Num {
        value: f64,
        int: bool,
    },
    Name(String),
    Call {
        name: String,
        args: Vec<Expr>,
    },
    /// `[a, b]`, meaningful only as a shape argument.
    List(Vec<Expr>),
    /// An operator written as a symbol (`+`, `^`, unary `-`, `<`, ...).
    Op {
        code: OpCode,
        args: Vec<Expr>,
    },
}

/// An expression and where it is.
#[derive(Debug)]
pub(super) struct Expr {
    pub ast: Ast,
    /// The operator token for operators, the name for calls, the first token otherwise; type
    /// errors point here.
    pub pos: Pos,
    /// The first token; errors about the expression as a whole (a wrong kind of argument) point here.
    pub start: Pos,
    depth: usize,
}

/// One statement (one line).
#[derive(Debug)]
pub(super) enum Stmt {
    /// `dim NAME = INT`; `value` is the literal as written (`-` sign included).
    Dim { name: Spanned, value: Spanned },
    /// `input NAME: DTYPE[d, ...]`; each size is a literal or a dim name.
    Input { name: Spanned, dtype: Spanned, shape: Vec<Spanned> },
    /// `NAME = EXPR`
    Bind { name: Spanned, expr: Expr },
    /// `output a, b`
    Output(Vec<Spanned>),
}

/// A token's text and position.
#[derive(Clone, Debug)]
pub(super) struct Spanned {
    pub text: String,
    pub pos: Pos,
    /// True for a number literal, false for a name.
    pub number: bool,
}

/// Binding power of a binary operator (higher binds tighter) and its op-table kind.
fn infix(p: &str) -> Option<(u8, Kind)> {
    let b = |op| Kind::Binary(op);
    Some(match p {
        "<" => (10, b(Binary::Lt)),
        "<=" => (10, b(Binary::Le)),
        ">" => (10, b(Binary::Gt)),
        ">=" => (10, b(Binary::Ge)),
        "==" => (10, b(Binary::Eq)),
        "!=" => (10, b(Binary::Ne)),
        "+" => (20, b(Binary::Add)),
        "-" => (20, b(Binary::Sub)),
        "*" => (30, b(Binary::Mul)),
        "/" => (30, b(Binary::Div)),
        "@" => (30, Kind::MatMul),
        "^" => (50, b(Binary::Pow)),
        _ => return None,
    })
}

const COMPARISON: u8 = 10;
/// Unary minus sits between `*` and `^`, as in Python: `-x^2` is `-(x^2)`, `-x*y` is `(-x)*y`.
const PREFIX: u8 = 40;
const POWER: u8 = 50;

/// Parses a token stream statement by statement.
pub(super) struct Parser {
    toks: Vec<Token>,
    i: usize,
    depth: usize,
}

impl Parser {
    pub(super) fn new(toks: Vec<Token>) -> Parser {
        Parser { toks, i: 0, depth: 0 }
    }

    fn peek(&self) -> &Token {
        // The lexer always ends the stream with `Eof`, and `next` never moves past it.
        &self.toks[self.i.min(self.toks.len() - 1)]
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::Eof {
            self.i += 1;
        }
        t
    }

    fn at_punct(&self, p: &str) -> bool {
        matches!(self.peek().tok, Tok::Punct(q) if q == p)
    }

    fn unexpected(&self, wanted: &str) -> PError {
        let t = self.peek();
        PError::new(t.pos, format!("expected {wanted}, found {}", t.tok.describe()))
    }

    fn expect_punct(&mut self, p: &str, wanted: &str) -> Result<Pos, PError> {
        if self.at_punct(p) {
            Ok(self.next().pos)
        } else {
            Err(self.unexpected(wanted))
        }
    }

    fn ident(&mut self, wanted: &str) -> Result<Spanned, PError> {
        match &self.peek().tok {
            Tok::Ident(s) => {
                let s = Spanned { text: s.clone(), pos: self.peek().pos, number: false };
                self.next();
                Ok(s)
            }
            _ => Err(self.unexpected(wanted)),
        }
    }

    /// The next statement, or `None` at the end of the file. Blank lines are skipped.
    pub(super) fn statement(&mut self) -> Result<Option<Stmt>, PError> {
        while self.peek().tok == Tok::Newline {
            self.next();
        }
        let stmt = match &self.peek().tok {
            Tok::Eof => return Ok(None),
            Tok::Ident(k) if k == "dim" => self.dim()?,
            Tok::Ident(k) if k == "input" => self.input()?,
            Tok::Ident(k) if k == "output" => self.output()?,
            Tok::Ident(_) => self.bind()?,
            _ => return Err(self.unexpected("a statement (`dim`, `input`, `output` or `NAME = ...`)")),
        };
        match self.peek().tok {
            Tok::Newline | Tok::Eof => Ok(Some(stmt)),
            _ => Err(self.unexpected("end of line")),
        }
    }

    fn dim(&mut self) -> Result<Stmt, PError> {
        self.next();
        let name = self.ident("a dim name after `dim`")?;
        self.expect_punct("=", "`=` after the dim name")?;
        let value = self.size("a positive integer size")?;
        Ok(Stmt::Dim { name, value })
    }

    /// A size: a number literal (a leading `-` kept, to be refused with a clear message) or a name.
    fn size(&mut self, wanted: &str) -> Result<Spanned, PError> {
        let pos = self.peek().pos;
        let minus = self.at_punct("-");
        if minus {
            self.next();
        }
        match &self.peek().tok {
            Tok::Number(n) => {
                let text = if minus { format!("-{n}") } else { n.clone() };
                self.next();
                Ok(Spanned { text, pos, number: true })
            }
            Tok::Ident(_) if !minus => self.ident(wanted),
            _ => Err(self.unexpected(wanted)),
        }
    }

    fn input(&mut self) -> Result<Stmt, PError> {
        self.next();
        let name = self.ident("an input name after `input`")?;
        self.expect_punct(":", "`:` and a type after the input name, as in `x: f32[N]`")?;
        let dtype = self.ident("a dtype (f32 f16 bf16 i32 bool)")?;
        self.expect_punct("[", "`[` and the shape after the dtype (`[]` for a scalar)")?;
        let mut shape = vec![];
        if !self.at_punct("]") {
            loop {
                shape.push(self.size("a size (an integer or a dim name)")?);
                if !self.at_punct(",") {
                    break;
                }
                self.next();
            }
        }
        self.expect_punct("]", "`,` or `]` in the shape")?;
        Ok(Stmt::Input { name, dtype, shape })
    }

    fn output(&mut self) -> Result<Stmt, PError> {
        self.next();
        let mut names = vec![self.ident("the name of a result after `output`")?];
        while self.at_punct(",") {
            self.next();
            names.push(self.ident("the name of a result after `,`")?);
        }
        Ok(Stmt::Output(names))
    }

    fn bind(&mut self) -> Result<Stmt, PError> {
        let name = self.ident("a name")?;
        self.expect_punct("=", "`=` after the name (a statement is `NAME = EXPR`)")?;
        let expr = self.expr(0)?;
        Ok(Stmt::Bind { name, expr })
    }

    /// Pratt loop: parses operators binding tighter than `min`.
    fn expr(&mut self, min: u8) -> Result<Expr, PError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            let msg = format!("expression nested more than {MAX_NESTING} deep; split it into named steps");
            return Err(PError::new(self.peek().pos, msg));
        }
        let result = self.expr_inner(min);
        self.depth -= 1;
        result
    }

    fn expr_inner(&mut self, min: u8) -> Result<Expr, PError> {
        let mut lhs = self.prefix()?;
        while let Some((bp, kind)) = self.infix_ahead().filter(|&(bp, _)| bp > min) {
            let pos = self.next().pos;
            // `^` is right-associative and its right side may start with unary minus (`2^-1`).
            let rhs = if bp == POWER { self.expr(PREFIX - 1)? } else { self.expr(bp)? };
            if bp == COMPARISON && self.infix_ahead().is_some_and(|(b, _)| b == COMPARISON) {
                let msg = "comparisons do not chain; use parentheses, e.g. `(a < b) == c`";
                return Err(PError::new(self.peek().pos, msg));
            }
            let start = lhs.start;
            lhs = node(Ast::Op { code: OpCode::of(kind), args: vec![lhs, rhs] }, pos, start)?;
        }
        Ok(lhs)
    }

    /// The binary operator at the next token, if it is one.
    fn infix_ahead(&self) -> Option<(u8, Kind)> {
        match self.peek().tok {
            Tok::Punct(p) => infix(p),
            _ => None,
        }
    }

    fn prefix(&mut self) -> Result<Expr, PError> {
        let t = self.next();
        match t.tok {
            Tok::Punct("-") => {
                let x = self.expr(PREFIX)?;
                node(Ast::Op { code: OpCode::of(Kind::Unary(Unary::Neg)), args: vec![x] }, t.pos, t.pos)
            }
            Tok::Punct("(") => {
                // Parentheses make no node and keep the inner operator's position, so type errors
                // point at the operator inside.
                let mut e = self.expr(0)?;
                self.expect_punct(")", "`)` or an operator")?;
                e.start = t.pos;
                Ok(e)
            }
            Tok::Punct("[") => {
                let items = self.list("]", "`,` or `]` in the list")?;
                node(Ast::List(items), t.pos, t.pos)
            }
            Tok::Number(n) => node(number(&n, t.pos)?, t.pos, t.pos),
            Tok::Ident(name) if self.at_punct("(") => {
                self.next();
                let args = self.list(")", "`,` or `)` after an argument")?;
                node(Ast::Call { name, args }, t.pos, t.pos)
            }
            Tok::Ident(name) => node(Ast::Name(name), t.pos, t.pos),
            tok => Err(PError::new(t.pos, format!("expected an expression, found {}", tok.describe()))),
        }
    }

    /// Comma-separated expressions up to `close` (already past the opening mark).
    fn list(&mut self, close: &str, wanted: &str) -> Result<Vec<Expr>, PError> {
        let mut items = vec![];
        if self.at_punct(close) {
            self.next();
            return Ok(items);
        }
        loop {
            items.push(self.expr(0)?);
            if self.at_punct(close) {
                self.next();
                return Ok(items);
            }
            self.expect_punct(",", wanted)?;
        }
    }
}

/// Builds a node, refusing trees deeper than [`MAX_DEPTH`] (a long `a + b + c + ...` chain grows
/// the tree without recursing in the parser).
fn node(ast: Ast, pos: Pos, start: Pos) -> Result<Expr, PError> {
    let children: &[Expr] = match &ast {
        Ast::Call { args, .. } | Ast::Op { args, .. } | Ast::List(args) => args,
        _ => &[],
    };
    let depth = 1 + children.iter().map(|c| c.depth).max().unwrap_or(0);
    if depth > MAX_DEPTH {
        let msg = format!("expression tree more than {MAX_DEPTH} deep; split it into named steps");
        return Err(PError::new(pos, msg));
    }
    Ok(Expr { ast, pos, start, depth })
}

/// Integers beyond 2^53 are refused rather than silently rounded to the nearest f64.
const MAX_EXACT_INT: u64 = 1 << 53;

fn number(text: &str, pos: Pos) -> Result<Ast, PError> {
    let int = text.bytes().all(|b| b.is_ascii_digit());
    if int {
        return match text.parse::<u64>() {
            Ok(v) if v <= MAX_EXACT_INT => Ok(Ast::Num { value: v as f64, int }),
            _ => Err(PError::new(pos, format!("integer `{text}` is too large (at most 2^53)"))),
        };
    }
    // Every value is at most f32 (a literal beyond its range would be an infinity on the GPU).
    match text.parse::<f64>() {
        Ok(v) if (v as f32).is_finite() => Ok(Ast::Num { value: v, int }),
        _ => Err(PError::new(pos, format!("number `{text}` is beyond the range of f32 (about 3.4e38)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::lex::lex;
    use super::*;

    /// The tree as an s-expression, for precedence checks.
    fn show(e: &Expr) -> String {
        match &e.ast {
            Ast::Num { value, .. } => value.to_string(),
            Ast::Name(n) => n.clone(),
            Ast::Call { name, args } => format!("({name} {})", args.iter().map(show).collect::<Vec<_>>().join(" ")),
            Ast::List(items) => format!("[{}]", items.iter().map(show).collect::<Vec<_>>().join(" ")),
            Ast::Op { code, args } => {
                format!("({} {})", code.name(), args.iter().map(show).collect::<Vec<_>>().join(" "))
            }
        }
    }

    fn parse(src: &str) -> Result<String, PError> {
        let mut p = Parser::new(lex(&format!("y = {src}"))?);
        match p.statement()? {
            Some(Stmt::Bind { expr, .. }) => Ok(show(&expr)),
            other => panic!("not a binding: {other:?}"),
        }
    }

    #[test]
    fn precedence() {
        assert_eq!(parse("a + b * c ^ d ^ e").unwrap(), "(+ a (* b (pow c (pow d e))))");
        assert_eq!(parse("-x ^ 2").unwrap(), "(neg (pow x 2))");
        assert_eq!(parse("-x * y").unwrap(), "(* (neg x) y)");
        assert_eq!(parse("2 ^ -x * y").unwrap(), "(* (pow 2 (neg x)) y)");
        assert_eq!(parse("a @ b * c").unwrap(), "(* (@ a b) c)");
        assert_eq!(parse("a - b - c").unwrap(), "(- (- a b) c)");
        assert_eq!(parse("a + b < c * d").unwrap(), "(< (+ a b) (* c d))");
        assert_eq!(parse("f(a, [2, N])").unwrap(), "(f a [2 N])");
    }

    #[test]
    fn errors() {
        assert!(parse("a < b < c").unwrap_err().msg.contains("do not chain"));
        assert!(parse("(a + b").unwrap_err().msg.contains("`)`"));
        assert!(parse("99999999999999999999").unwrap_err().msg.contains("too large"));
        assert!(parse("1e999").unwrap_err().msg.contains("beyond the range of f32"));
        let deep = "(".repeat(500) + "x" + &")".repeat(500);
        assert!(parse(&deep).unwrap_err().msg.contains("nested"));
        let long = vec!["x"; 500].join(" + ");
        assert!(parse(&long).unwrap_err().msg.contains("tree more than 256 deep"));
        let minus = "-".repeat(500) + "x";
        assert!(parse(&minus).unwrap_err().msg.contains("nested"));
    }
}
