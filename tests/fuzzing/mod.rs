//! Mutations shared by the fuzz tests (`fuzz_parser.rs`, the front ends in process, and
//! `fuzz_cli.rs`, the whole command line): a fixed-seed xorshift, text mutations (characters,
//! tokens, lines), token soup, ill-typed random programs and structural JSON graph mutations.
#![allow(dead_code)]

use std::fs;
use std::path::Path;

use eqfuse::{Kind, OpInfo, OPS};
use serde_json::Value;

/// xorshift64*: small, fast and good enough to pick mutations.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Tokens worth inserting: keywords, every function, dtypes, operators and awkward numbers.
pub fn token_pool() -> Vec<String> {
    let mut pool: Vec<String> = [
        "dim",
        "input",
        "output",
        "x",
        "y",
        "N",
        "R",
        "C",
        "f32",
        "f16",
        "bf16",
        "i32",
        "bool",
        "f64",
        "(",
        ")",
        "[",
        "]",
        ",",
        ":",
        "=",
        "+",
        "-",
        "*",
        "/",
        "@",
        "^",
        "<",
        "<=",
        ">",
        ">=",
        "==",
        "!=",
        "**",
        "!",
        "#",
        "\n",
        "0",
        "1",
        "-1",
        "2",
        "3",
        "0.5",
        "1e-5",
        "1e400",
        "1e-400",
        "99999999999999999999",
        "9007199254740993",
        "281474976710656",
        "4294967296",
        ".5",
        "1.",
        "1e",
        "2x",
        "_",
        "é",
        "\t",
        "$",
        "\"",
        "[]",
        "()",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    pool.extend(OPS.iter().map(|o| o.name.to_string()));
    pool
}

/// Splits text into tokens and the gaps between them, so mutations keep most of a program intact.
pub fn split_tokens(s: &str) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    let mut cur = String::new();
    for c in s.chars() {
        let word = c.is_alphanumeric() || c == '_' || c == '.';
        if !word && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        if word {
            cur.push(c);
        } else {
            out.push(c.to_string());
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

pub fn mutate_chars(rng: &mut Rng, s: &str) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    let alphabet: Vec<char> = "aZ_09.,:=+-*/@^<>!()[]#\n\t \0é€e".chars().collect();
    for _ in 0..=rng.below(3) {
        if chars.is_empty() {
            break;
        }
        let i = rng.below(chars.len());
        match rng.below(3) {
            0 => chars[i] = *rng.pick(&alphabet),
            1 => {
                chars.remove(i);
            }
            _ => chars.insert(i, *rng.pick(&alphabet)),
        }
    }
    chars.into_iter().collect()
}

pub fn mutate_tokens(rng: &mut Rng, s: &str, pool: &[String]) -> String {
    let mut toks = split_tokens(s);
    for _ in 0..=rng.below(4) {
        if toks.is_empty() {
            toks.push(rng.pick(pool).clone());
            continue;
        }
        let i = rng.below(toks.len());
        match rng.below(4) {
            0 => {
                toks.remove(i);
            }
            1 => {
                let t = toks[i].clone();
                toks.insert(i, t);
            }
            2 => {
                let j = rng.below(toks.len());
                toks.swap(i, j);
            }
            _ => toks.insert(i, rng.pick(pool).clone()),
        }
    }
    toks.concat()
}

pub fn mutate_lines(rng: &mut Rng, s: &str) -> String {
    let mut lines: Vec<&str> = s.lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let (i, j) = (rng.below(lines.len()), rng.below(lines.len()));
    match rng.below(3) {
        0 => {
            lines.remove(i);
        }
        1 => lines.insert(i, lines[j]),
        _ => lines.swap(i, j),
    }
    lines.join("\n")
}

pub fn token_soup(rng: &mut Rng, pool: &[String]) -> String {
    let n = 1 + rng.below(40);
    (0..n).map(|_| rng.pick(pool).clone()).collect::<Vec<_>>().join(if rng.chance(50) { " " } else { "" })
}

/// A random program over small random inputs: mostly ill typed, which is the point.
pub fn random_program(rng: &mut Rng) -> String {
    // Mostly one dtype, so that more programs get past dtype checks to the shape checks.
    let dtypes = ["f32", "f32", "f32", "f32", "f32", "f32", "f16", "bf16", "i32", "bool"];
    let mut text = String::from("dim N = 3\n");
    let inputs = 1 + rng.below(3);
    for i in 0..inputs {
        let rank = 1 + rng.below(3);
        // Mostly small sizes; sometimes 2^40, so that products of sizes overflow.
        let sizes = ["1", "1", "2", "3", "N", "4", "1", "3", "1099511627776", "1099511627776"];
        let dims: Vec<String> = (0..rank).map(|_| rng.pick(&sizes).to_string()).collect();
        text += &format!("input v{i}: {}[{}]\n", rng.pick(&dtypes), dims.join(", "));
    }
    let depth = 1 + rng.below(4);
    text += &format!("out = {}\noutput out\n", random_expr(rng, inputs, depth));
    text
}

pub fn random_expr(rng: &mut Rng, inputs: usize, depth: usize) -> String {
    if depth == 0 || rng.chance(20) {
        return match rng.below(4) {
            0 => rng.pick(&["0", "1", "-1", "2", "0.5", "N", "-2", "3"]).to_string(),
            _ => format!("v{}", rng.below(inputs)),
        };
    }
    let op = random_op(rng);
    let mut sub = || random_expr(rng, inputs, depth - 1);
    let (a, b, c) = (sub(), sub(), sub());
    let args: Vec<String> = match op.kind {
        Kind::Cast => vec![a, rng.pick(&["f32", "bf16", "i32", "bool", "x"]).to_string()],
        Kind::Reshape | Kind::Broadcast => {
            let shapes = ["[3]", "[1, 3]", "[N, 2]", "[]", "[2, 3, 1]", "[1099511627776, 3]", "[3, 1099511627776]"];
            vec![a, rng.pick(&shapes).to_string()]
        }
        _ => [a, b, c].into_iter().take(op.arity).collect(),
    };
    if op.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        format!("{}({})", op.name, args.join(", "))
    } else if op.arity == 2 {
        format!("({} {} {})", args[0], op.name, args[1])
    } else {
        format!("-{}", args[0])
    }
}

/// An operator, weighted towards those that combine shapes (broadcasting, products, layout).
pub fn random_op(rng: &mut Rng) -> &'static OpInfo {
    let shapes = |k: Kind| matches!(k, Kind::Binary(_) | Kind::MatMul);
    let layout = |k: Kind| matches!(k, Kind::Reshape | Kind::Broadcast | Kind::Transpose | Kind::Reduce(_));
    let candidates: Vec<&'static OpInfo> = match rng.below(10) {
        0..=3 => OPS.iter().filter(|o| shapes(o.kind)).collect(),
        4 | 5 => OPS.iter().filter(|o| layout(o.kind)).collect(),
        _ => OPS.iter().collect(),
    };
    candidates[rng.below(candidates.len())]
}

/// A structural mutation of a graph: a node, dim, input or output gets a wrong field.
pub fn mutate_graph(rng: &mut Rng, g: &mut Value, pool: &[String]) {
    let odd = || {
        vec![
            Value::from(-1),
            Value::from(0),
            Value::from(u64::MAX),
            Value::from(1u64 << 50),
            Value::from(0.5),
            Value::from("x"),
            Value::from("bf16"),
            Value::Null,
            Value::from(vec![0, 1]),
            Value::from(vec![u64::MAX, 2]),
            serde_json::json!({"a": 1}),
        ]
    };
    let n = g["nodes"].as_array().map_or(0, |a| a.len());
    let target = match rng.below(4) {
        0 => &mut g["inputs"],
        1 => &mut g["outputs"],
        2 => &mut g["dims"],
        _ => &mut g["nodes"],
    };
    let Some(items) = target.as_array_mut() else { return };
    if items.is_empty() {
        return;
    }
    let i = rng.below(items.len());
    let Some(obj) = items[i].as_object_mut() else { return };
    let keys: Vec<String> =
        obj.keys().cloned().chain(["op", "args", "value", "node", "shape"].map(String::from)).collect();
    let key = rng.pick(&keys).clone();
    let value = match rng.below(4) {
        0 => Value::from(rng.pick(pool).as_str()),
        1 => Value::from(vec![rng.below(n + 2), rng.below(n + 2)]),
        _ => rng.pick(&odd()).clone(),
    };
    obj.insert(key, value);
}

/// Mostly none; sometimes sizes for the dims the corpus uses, at the edges of what is allowed.
pub fn random_overrides(rng: &mut Rng) -> Vec<(String, usize)> {
    if !rng.chance(10) {
        return vec![];
    }
    let name = rng.pick(&["N", "R", "C", "B", "Q", "1x"]).to_string();
    let size = *rng.pick(&[0, 1, 2, 3, 1 << 24, 1 << 48, (1 << 48) + 1, usize::MAX]);
    vec![(name, size)]
}

pub fn corpus() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut texts = vec![];
    for dir in ["examples", "tests/cases/ok", "tests/cases/err"] {
        let mut files: Vec<_> = fs::read_dir(root.join(dir)).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        texts.extend(
            files.iter().filter(|p| p.extension().is_some_and(|x| x == "eqf")).map(|p| fs::read_to_string(p).unwrap()),
        );
    }
    texts
}
