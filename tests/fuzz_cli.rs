//! Fuzzing the whole command line (issue 18): random and mutated programs (`.eqf`), JSON graphs,
//! ONNX models, device profiles (`--device FILE`), rule folders (`--rules DIR`), `.npy` inputs
//! (`run --cpu --inputs DIR`) and option values, each run through the real binary as a user runs
//! it: `optimize` (every format), `explain`, `codegen -o DIR`, `export` and `run --cpu`.
//!
//! Every run is a subprocess in a scratch folder, under a timeout and an address-space limit, so
//! panics (exit 101 with `panicked` on stderr), aborts (signals: stack overflow, failed
//! allocation) and hangs are seen as a user sees them. A run passes when it
//! - exits 0 and its output is what the command promises: `optimize --format json` prints the
//!   plan contract (docs/plan-schema.md), `export` prints a graph that eqfuse reads back (its
//!   export exits 0 and prints the same graph), `codegen` writes `plan.json`, `launch.json` and
//!   `.cu` files that NVRTC compiles (all unique sources up to `EQFUSE_FUZZ_NVRTC_MAX`, chosen by
//!   hash), `run --cpu` writes `.npy` files that `npyz` reads in full;
//! - or exits 1 with `error:` on stderr (bad input), or 2 (a usage error, from clap).
//!
//! Anything else is a failure: the input is printed with its command, written to
//! `tests/cases/fuzz_cli/<hash>/` (the files of the scratch folder plus `cmd`, the arguments one
//! a line after `#` comments saying what failed; `# timeout: SECS` gives a case its own time
//! limit) and the test fails. Every kept case there is replayed first, on every run.
//!
//! Inputs are drawn from a fixed-seed xorshift, one generator per input index, so a run is
//! deterministic whatever the number of workers. Sizes are kept small (dims overridden, small
//! node limits and time limits for most runs), except for deliberate huge sizes.
//!
//! Environment:
//! - `EQFUSE_FUZZ_REPORT=1`: report mode: print a table of failures grouped by class, with a
//!   count and an example command each, and do not fail;
//! - `EQFUSE_FUZZ_CASES` (default 1000, so that a plain `cargo test` stays quick; CI runs 10,000
//!   built optimised with overflow checks: `EQFUSE_FUZZ_CASES=10000 cargo test --profile ci
//!   --test fuzz_cli`), `EQFUSE_FUZZ_SEED`, `EQFUSE_FUZZ_WORKERS` (2 to 4 by default),
//!   `EQFUSE_FUZZ_TIMEOUT` (seconds a run may take, default 30),
//!   `EQFUSE_FUZZ_NVRTC_MAX` (default 200; about 65 ms a source on two cores),
//!   `EQFUSE_FUZZ_SAVE` (1: write the first input of each failure class to
//!   `tests/cases/fuzz_cli/`; the default in CI mode, not in report mode);
//! - NVRTC as in tests/nvrtc.rs: without it the compile check is skipped with a message, unless
//!   `CI=true`, where a missing NVRTC fails.

mod fuzzing;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use eqfuse::{parse_program, program_from_onnx, program_to_json, DType, Program};
use fuzzing::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_eqfuse");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Address-space limit of each run (KiB): a run that asks for more fails to allocate instead of
/// taking the machine's memory.
const MEM_LIMIT_KB: u64 = 4 << 20;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn cases_dir() -> PathBuf {
    Path::new(ROOT).join("tests/cases/fuzz_cli")
}

// ---------------------------------------------------------------------------------------------
// Inputs

/// One fuzz input: the files of a scratch folder and the arguments run in it.
#[derive(Clone, Debug)]
struct Input {
    /// Which generator made it (`eqf-corpus`, `profile`, ...), or `kept` for a saved case.
    origin: String,
    /// Relative path and contents; a folder holds at least a `.keep` file.
    files: Vec<(String, Vec<u8>)>,
    args: Vec<String>,
    stdin: Option<Vec<u8>>,
    /// A kept case's own time limit (`# timeout: SECS` in `cmd`), else `EQFUSE_FUZZ_TIMEOUT`.
    timeout: Option<Duration>,
}

fn s(x: &str) -> String {
    x.to_string()
}

impl Input {
    fn surface(&self) -> &'static str {
        match self.args.first().map(String::as_str) {
            Some("optimize") => "optimize",
            Some("explain") => "explain",
            Some("codegen") => "codegen",
            Some("export") => "export",
            Some("run") => "run --cpu",
            _ => "other",
        }
    }

    fn flag(&self, name: &str) -> Option<&str> {
        self.args.iter().position(|a| a == name).and_then(|i| self.args.get(i + 1)).map(String::as_str)
    }

    fn command_line(&self) -> String {
        let quoted: Vec<String> = self.args.iter().map(|a| shell_quote(a)).collect();
        let stdin = if self.stdin.is_some() { " < stdin" } else { "" };
        format!("eqfuse {}{stdin}", quoted.join(" "))
    }

    /// FNV-1a over the files, arguments and stdin: names saved cases.
    fn hash(&self) -> u64 {
        let mut h = Fnv::default();
        for (name, bytes) in &self.files {
            h.write(name.as_bytes());
            h.write(&[0]);
            h.write(bytes);
            h.write(&[1]);
        }
        for a in &self.args {
            h.write(a.as_bytes());
            h.write(&[2]);
        }
        if let Some(b) = &self.stdin {
            h.write(b);
        }
        h.0
    }

    /// Writes the files into `dir`.
    fn materialize(&self, dir: &Path) -> std::io::Result<()> {
        for (name, bytes) in &self.files {
            let path = dir.join(name);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write(path, bytes)?;
        }
        Ok(())
    }

    /// A description for a failure message: the command and the text files (binary ones by size).
    fn describe(&self) -> String {
        let mut out = format!("origin: {}\ncommand: {}\n", self.origin, self.command_line());
        let stdin = self.stdin.iter().map(|b| (s("stdin"), b.clone()));
        for (name, bytes) in self.files.iter().cloned().chain(stdin) {
            match std::str::from_utf8(&bytes) {
                Ok(t) if t.len() <= 1500 => out += &format!("--- {name}\n{t}\n"),
                Ok(t) => out += &format!("--- {name} ({} bytes, first 600)\n{}\n", t.len(), head_chars(t, 600)),
                Err(_) => out += &format!("--- {name}: {} bytes, binary\n", bytes.len()),
            }
        }
        out
    }
}

fn head_chars(t: &str, n: usize) -> &str {
    match t.char_indices().nth(n) {
        Some((i, _)) => &t[..i],
        None => t,
    }
}

fn shell_quote(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:".contains(c)) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

#[derive(Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x100_0000_01b3);
        }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h = Fnv::default();
    h.write(bytes);
    h.0
}

// ---------------------------------------------------------------------------------------------
// The corpus the generators start from

/// A program the generators can run: its text, the `--dim` overrides that make it small, and
/// (when it parses with them) its inputs, for `.npy` files.
struct Base {
    text: String,
    small_dims: Vec<(String, usize)>,
    program: Option<Program>,
}

struct Onnx {
    bytes: Vec<u8>,
    dims: Vec<(String, usize)>,
    program: Option<Program>,
}

struct Corpus {
    eqf: Vec<Base>,
    /// JSON graphs of the small valid programs.
    graphs: Vec<Value>,
    onnx: Vec<Onnx>,
    profiles: Vec<(String, Value)>,
    rules: Vec<(String, String)>,
    pool: Vec<String>,
    /// Parsed programs small enough to run on the CPU reference quickly.
    small: Vec<usize>,
}

fn read_dir_sorted(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        fs::read_dir(dir).map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|x| x == ext));
    files.sort();
    files
}

/// Declared dims of a program text (`dim NAME = V`).
fn declared_dims(text: &str) -> Vec<(String, usize)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("dim ")?;
            let (name, value) = rest.split_once('=')?;
            Some((name.trim().to_string(), value.split('#').next()?.trim().parse().ok()?))
        })
        .collect()
}

fn numel(p: &Program) -> usize {
    p.inputs.iter().map(|i| i.ty.shape.iter().product::<usize>()).sum()
}

/// The first of a few ways of shrinking a program's dims that still parses, and the program.
fn shrink(name: &str, text: &str) -> (Vec<(String, usize)>, Option<Program>) {
    let dims = declared_dims(text);
    // Dividing the multiples of 64 by one factor keeps products such as E = H x Dh.
    let schemes: [&dyn Fn(usize) -> usize; 5] = [
        &|v| v.min(8),
        &|v| if v > 64 { (v / 64).max(1) } else { v.min(16) },
        &|v| if v % 64 == 0 { v / 32 } else { v.min(16) },
        &|v| if v % 64 == 0 { v / 32 } else { v },
        &|v| v.min(32),
    ];
    for f in schemes {
        let o: Vec<(String, usize)> = dims.iter().map(|(n, v)| (n.clone(), f(*v))).collect();
        if let Ok(p) = parse_program(name, text, &o) {
            return (o, Some(p));
        }
    }
    (vec![], None)
}

fn load_corpus() -> Corpus {
    let root = Path::new(ROOT);
    let mut eqf = vec![];
    for dir in ["examples", "tests/cases/ok", "tests/cases/err", "tests/cases/diff"] {
        for path in read_dir_sorted(&root.join(dir), "eqf") {
            let text = fs::read_to_string(&path).unwrap();
            let name = format!("{dir}/{}", path.file_name().unwrap().to_string_lossy());
            let (small_dims, program) = shrink(&name, &text);
            eqf.push(Base { text, small_dims, program });
        }
    }
    let graphs: Vec<Value> =
        eqf.iter().filter_map(|b| b.program.as_ref()).filter(|p| numel(p) <= 1 << 16).map(program_to_json).collect();
    let mut onnx = vec![];
    let mut models: Vec<PathBuf> =
        read_dir_sorted(&root.join("tests/onnx"), "onnx").into_iter().chain(read_dir_sorted_models(root)).collect();
    models.sort();
    for path in models {
        let bytes = fs::read(&path).unwrap();
        let name = path.strip_prefix(root).unwrap().display().to_string();
        // Symbolic dims: sized by the names the error asks for, else the model's own.
        let dims: Vec<(String, usize)> =
            ["n", "N", "B", "S", "batch", "seq"].iter().map(|n| (n.to_string(), 3)).collect();
        let program = program_from_onnx(&name, &bytes, &[]).ok();
        let with_dims = program_from_onnx(&name, &bytes, &dims).ok();
        let (dims, program) = match (program, with_dims) {
            (Some(p), _) => (vec![], Some(p)),
            (None, Some(p)) => (dims, Some(p)),
            (None, None) => (vec![], None),
        };
        onnx.push(Onnx { bytes, dims, program });
    }
    let profiles = read_dir_sorted(&root.join("profiles"), "json")
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            (name, serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap())
        })
        .collect();
    let rules = read_dir_sorted(&root.join("rules"), "rules")
        .into_iter()
        .map(|p| (p.file_name().unwrap().to_string_lossy().to_string(), fs::read_to_string(&p).unwrap()))
        .collect();
    let small = (0..eqf.len()).filter(|&i| eqf[i].program.as_ref().is_some_and(|p| numel(p) <= 1 << 14)).collect();
    Corpus { eqf, graphs, onnx, profiles, rules, pool: token_pool(), small }
}

fn read_dir_sorted_models(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(root.join("tests/onnx"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").is_file())
        .map(|p| p.join("model.onnx"))
        .collect();
    dirs.sort();
    dirs
}

// ---------------------------------------------------------------------------------------------
// Generators

/// A program for the command: file name, bytes, `--dim` arguments, and its parse (if known).
struct Prog {
    file: String,
    bytes: Vec<u8>,
    dims: Vec<(String, String)>,
    program: Option<Program>,
    /// Whether the run may be slow (real sizes): then only cheap surfaces.
    big: bool,
}

fn small_base<'a>(rng: &mut Rng, c: &'a Corpus) -> &'a Base {
    &c.eqf[*rng.pick(&c.small)]
}

fn dims_args(dims: &[(String, usize)]) -> Vec<(String, String)> {
    dims.iter().map(|(n, v)| (n.clone(), v.to_string())).collect()
}

/// A well-typed random program from `gen_program` (small by construction).
fn generated(rng: &mut Rng) -> Prog {
    let recipe = eqfuse::random_recipe(rng.next(), 1 + rng.below(10));
    let text = recipe.render();
    let program = parse_program("prog.eqf", &text, &[]).ok();
    Prog { file: s("prog.eqf"), bytes: text.into_bytes(), dims: vec![], program, big: false }
}

/// A valid, small program: generated, or from the corpus with its small dims.
fn valid_prog(rng: &mut Rng, c: &Corpus) -> Prog {
    if rng.chance(50) {
        return generated(rng);
    }
    let b = small_base(rng, c);
    Prog {
        file: s("prog.eqf"),
        bytes: b.text.clone().into_bytes(),
        dims: dims_args(&b.small_dims),
        program: b.program.clone(),
        big: false,
    }
}

fn corpus_prog(rng: &mut Rng, c: &Corpus) -> Prog {
    let b = rng.pick(&c.eqf);
    let mut text = b.text.clone();
    let mutated = rng.chance(65);
    if mutated {
        for _ in 0..=rng.below(2) {
            text = match rng.below(3) {
                0 => mutate_chars(rng, &text),
                1 => mutate_tokens(rng, &text, &c.pool),
                _ => mutate_lines(rng, &text),
            };
        }
    }
    // Small dims, except sometimes the declared ones (only for cheap surfaces) or huge ones.
    let small = b.program.as_ref().is_some_and(|p| numel(p) <= 1 << 14);
    let (dims, big) = match rng.below(100) {
        0..=2 => (huge_dims(rng, &b.small_dims), true),
        3..=5 => (vec![], b.small_dims != declared_dims(&b.text) || !small),
        _ => (dims_args(&b.small_dims), !small),
    };
    let program = if mutated { None } else { b.program.clone() };
    Prog { file: s("prog.eqf"), bytes: text.into_bytes(), dims, program, big }
}

fn huge_dims(rng: &mut Rng, dims: &[(String, usize)]) -> Vec<(String, String)> {
    let mut out = dims_args(dims);
    if out.is_empty() {
        out.push((s("N"), s("3")));
    }
    let i = rng.below(out.len());
    out[i].1 =
        rng.pick(&["2147483648", "4294967296", "1099511627776", "281474976710656", "65536", "16777216"]).to_string();
    out
}

/// Deep programs: nested calls (the parser's recursion), long chains of statements or JSON nodes
/// (every pass over the expression).
fn deep_prog(rng: &mut Rng) -> Prog {
    // Planning a long chain takes seconds to minutes in a debug build (the planner's time limit
    // does not bound extraction yet): long chains go only to `export` and `run --cpu`. Those
    // stop at 3,000 statements: in a debug build egg's `RecExpr::add` checks its children with
    // a `debug_assert` that walks the whole expression, so loading n statements takes O(n^2)
    // (20,000 take 50 s; a release build does not have it).
    let d = *rng.pick(&[30usize, 60, 100, 1000, 3000]);
    let op = *rng.pick(&["neg", "exp", "relu", "abs"]);
    let (file, text) = match rng.below(4) {
        0 => ("prog.eqf", format!("input x: f32[3]\ny = {}x{}\noutput y\n", format!("{op}(").repeat(d), ")".repeat(d))),
        1 => ("prog.eqf", format!("input x: f32[3]\ny = {}x{}\noutput y\n", "(".repeat(d), ")".repeat(d))),
        2 => {
            let mut t = String::from("input x: f32[3]\nt0 = x\n");
            for i in 1..d {
                t += &format!("t{i} = {op}(t{}) + t{}\n", i - 1, i / 2);
            }
            ("prog.eqf", t + &format!("output t{}\n", d - 1))
        }
        _ => {
            let mut nodes = vec![serde_json::json!({"op": "input", "value": "x"})];
            for i in 1..d {
                nodes.push(serde_json::json!({"op": op, "args": [i - 1]}));
            }
            let g = serde_json::json!({"schema": "eqfuse.graph/1",
                "inputs": [{"name": "x", "dtype": "f32", "shape": [3]}],
                "nodes": nodes, "outputs": [{"name": "y", "node": d - 1}]});
            ("prog.json", g.to_string())
        }
    };
    Prog { file: s(file), bytes: text.into_bytes(), dims: vec![], program: None, big: d > 60 }
}

fn illtyped_prog(rng: &mut Rng, c: &Corpus) -> Prog {
    let text = if rng.chance(80) { random_program(rng) } else { token_soup(rng, &c.pool) };
    // Ill-typed programs may still declare 2^40-element inputs: only cheap surfaces run them.
    let big = text.contains("1099511627776");
    Prog { file: s("prog.eqf"), bytes: text.into_bytes(), dims: vec![], program: None, big }
}

fn json_prog(rng: &mut Rng, c: &Corpus) -> Prog {
    let mut g = rng.pick(&c.graphs).clone();
    let text = match rng.below(10) {
        0..=2 => g.to_string(),
        3..=6 => {
            for _ in 0..=rng.below(2) {
                mutate_graph(rng, &mut g, &c.pool);
            }
            serde_json::to_string_pretty(&g).unwrap()
        }
        _ => {
            let t = g.to_string();
            if rng.chance(50) {
                mutate_chars(rng, &t)
            } else {
                mutate_tokens(rng, &t, &c.pool)
            }
        }
    };
    let big = text.contains(&(1u64 << 50).to_string()) || text.contains(&u64::MAX.to_string());
    Prog { file: s("prog.json"), bytes: text.into_bytes(), dims: vec![], program: None, big }
}

// --- ONNX: protobuf wire format, mutated field by field

#[derive(Clone, Debug)]
enum Wire {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(Vec<u8>),
    Fixed32([u8; 4]),
}

fn read_varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn parse_wire(b: &[u8]) -> Option<Vec<(u64, Wire)>> {
    let mut i = 0;
    let mut out = vec![];
    while i < b.len() {
        let key = read_varint(b, &mut i)?;
        let (num, ty) = (key >> 3, key & 7);
        if num == 0 {
            return None;
        }
        let v = match ty {
            0 => Wire::Varint(read_varint(b, &mut i)?),
            1 => {
                let v = b.get(i..i + 8)?.try_into().ok()?;
                i += 8;
                Wire::Fixed64(v)
            }
            2 => {
                let n = read_varint(b, &mut i)? as usize;
                let v = b.get(i..i.checked_add(n)?)?.to_vec();
                i += n;
                Wire::Bytes(v)
            }
            5 => {
                let v = b.get(i..i + 4)?.try_into().ok()?;
                i += 4;
                Wire::Fixed32(v)
            }
            _ => return None,
        };
        out.push((num, v));
    }
    Some(out)
}

fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn encode_wire(fields: &[(u64, Wire)]) -> Vec<u8> {
    let mut out = vec![];
    for (num, v) in fields {
        let ty = match v {
            Wire::Varint(_) => 0,
            Wire::Fixed64(_) => 1,
            Wire::Bytes(_) => 2,
            Wire::Fixed32(_) => 5,
        };
        write_varint(&mut out, num << 3 | ty);
        match v {
            Wire::Varint(x) => write_varint(&mut out, *x),
            Wire::Fixed64(x) => out.extend(x),
            Wire::Bytes(x) => {
                write_varint(&mut out, x.len() as u64);
                out.extend(x);
            }
            Wire::Fixed32(x) => out.extend(x),
        }
    }
    out
}

/// One mutation somewhere in a message: descends into sub-messages, then changes, deletes or
/// duplicates a field, or swaps a number or string for an awkward one.
fn mutate_message(rng: &mut Rng, bytes: &[u8], pool: &[String], depth: usize) -> Vec<u8> {
    let Some(mut fields) = parse_wire(bytes).filter(|f| !f.is_empty()) else {
        return mutate_raw(rng, bytes);
    };
    let i = rng.below(fields.len());
    if let Wire::Bytes(inner) = &fields[i].1 {
        let nested = parse_wire(inner).is_some_and(|f| !f.is_empty());
        if nested && depth < 8 && rng.chance(75) {
            let m = mutate_message(rng, inner, pool, depth + 1);
            fields[i].1 = Wire::Bytes(m);
            return encode_wire(&fields);
        }
    }
    match rng.below(10) {
        0 => {
            fields.remove(i);
        }
        1 => {
            let f = fields[i].clone();
            fields.insert(i, f);
        }
        2 => {
            let j = rng.below(fields.len());
            fields.swap(i, j);
        }
        _ => {
            let odd = [0u64, 1, 2, 3, 7, 13, 16, 17, u64::MAX, u64::MAX - 1, 1 << 31, 1 << 32, 1 << 40, 1 << 62];
            fields[i].1 = match &fields[i].1 {
                Wire::Varint(v) => Wire::Varint(match rng.below(3) {
                    0 => v.wrapping_add(1),
                    1 => v.wrapping_sub(1),
                    _ => *rng.pick(&odd),
                }),
                Wire::Bytes(b) if std::str::from_utf8(b).is_ok() && rng.chance(60) => {
                    let names = [
                        "",
                        "x",
                        "Add",
                        "MatMul",
                        "Softmax",
                        "LayerNormalization",
                        "Gemm",
                        "Reshape",
                        "axis",
                        "perm",
                        "N",
                    ];
                    let t = if rng.chance(50) { rng.pick(&names).to_string() } else { rng.pick(pool).clone() };
                    Wire::Bytes(t.into_bytes())
                }
                Wire::Bytes(b) => Wire::Bytes(mutate_raw(rng, b)),
                Wire::Fixed32(_) => {
                    let f = *rng.pick(&[f32::NAN, f32::INFINITY, -0.0, 1e38, -1.0, 0.0]);
                    Wire::Fixed32(f.to_le_bytes())
                }
                Wire::Fixed64(_) => Wire::Fixed64(rng.pick(&[f64::NAN, 1e308, 0.0, -1.0]).to_le_bytes()),
            };
        }
    }
    encode_wire(&fields)
}

fn mutate_raw(rng: &mut Rng, b: &[u8]) -> Vec<u8> {
    let mut b = b.to_vec();
    match rng.below(4) {
        0 => b.truncate(rng.below(b.len() + 1)),
        1 if !b.is_empty() => {
            let i = rng.below(b.len());
            b[i] ^= 1 << rng.below(8);
        }
        2 if !b.is_empty() => {
            let i = rng.below(b.len());
            b[i] = rng.next() as u8;
        }
        _ => b.extend((0..1 + rng.below(8)).map(|_| rng.next() as u8)),
    }
    b
}

fn onnx_prog(rng: &mut Rng, c: &Corpus) -> Prog {
    let m = rng.pick(&c.onnx);
    let mut bytes = m.bytes.clone();
    let mutated = rng.chance(75);
    if mutated {
        for _ in 0..=rng.below(2) {
            bytes = if rng.chance(85) { mutate_message(rng, &bytes, &c.pool, 0) } else { mutate_raw(rng, &bytes) };
        }
    }
    let mut dims = dims_args(&m.dims);
    if rng.chance(10) {
        dims.push((
            rng.pick(&["N", "B", "S", "batch"]).to_string(),
            rng.pick(&["0", "1", "5", "4294967296"]).to_string(),
        ));
    }
    let program = if mutated { None } else { m.program.clone() };
    Prog { file: s("model.onnx"), bytes, dims, program, big: false }
}

// --- device profiles

/// Paths to every value of a JSON document (object keys and array indices).
fn json_paths(v: &Value, prefix: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                prefix.push(Value::from(k.as_str()));
                out.push(prefix.clone());
                json_paths(x, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                prefix.push(Value::from(i));
                out.push(prefix.clone());
                json_paths(x, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn mutate_profile(rng: &mut Rng, c: &Corpus) -> Vec<u8> {
    let (_, base) = rng.pick(&c.profiles);
    let mut v = base.clone();
    if rng.chance(10) {
        let t = serde_json::to_string_pretty(&v).unwrap();
        let t = if rng.chance(50) { mutate_chars(rng, &t) } else { mutate_tokens(rng, &t, &c.pool) };
        return t.into_bytes();
    }
    for _ in 0..=rng.below(2) {
        let mut paths = vec![];
        json_paths(&v, &mut vec![], &mut paths);
        // Mostly numbers: they are what the cost model divides by.
        let numeric: Vec<&Vec<Value>> =
            paths.iter().filter(|p| get_path(&v, p).is_some_and(Value::is_number)).collect();
        let path =
            if rng.chance(75) && !numeric.is_empty() { rng.pick(&numeric).to_vec() } else { rng.pick(&paths).clone() };
        let (last, parent_path) = path.split_last().unwrap();
        let Some(parent) = get_path_mut(&mut v, parent_path) else { continue };
        let odd = [
            Value::from(0),
            Value::from(0.0),
            Value::from(-1),
            Value::from(-1e-9),
            Value::from(1e-300),
            Value::from(1e300),
            Value::from(f64::MAX),
            Value::from(u64::MAX),
            Value::from(i64::MIN),
            Value::from("NaN"),
            Value::from("inf"),
            Value::from("1.0"),
            Value::Null,
            Value::Bool(true),
            serde_json::json!([]),
            serde_json::json!({}),
            Value::from(0.5),
            Value::from(4),
        ];
        match (parent, last) {
            (Value::Object(m), Value::String(k)) => match rng.below(8) {
                0 => {
                    m.remove(k);
                }
                1 => {
                    if let Some(x) = m.remove(k) {
                        let misspelled = if rng.chance(50) { format!("{k}s") } else { k.replacen('_', "", 1) };
                        m.insert(misspelled, x);
                    }
                }
                _ => {
                    m.insert(k.clone(), rng.pick(&odd).clone());
                }
            },
            (Value::Array(a), Value::Number(i)) => {
                let i = i.as_u64().unwrap() as usize;
                if rng.chance(30) {
                    a.remove(i);
                } else {
                    a[i] = rng.pick(&odd).clone();
                }
            }
            _ => {}
        }
    }
    serde_json::to_string_pretty(&v).unwrap().into_bytes()
}

fn get_path<'a>(v: &'a Value, path: &[Value]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| match k {
        Value::String(k) => v.get(k),
        Value::Number(i) => v.get(i.as_u64()? as usize),
        _ => None,
    })
}

fn get_path_mut<'a>(v: &'a mut Value, path: &[Value]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| match k {
        Value::String(k) => v.get_mut(k),
        Value::Number(i) => v.get_mut(i.as_u64()? as usize),
        _ => None,
    })
}

// --- rule files: s-expressions

#[derive(Clone, Debug)]
enum Sexp {
    Atom(String),
    List(Vec<Sexp>),
}

impl std::fmt::Display for Sexp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sexp::Atom(a) => write!(f, "{a}"),
            Sexp::List(xs) => {
                write!(f, "(")?;
                for (i, x) in xs.iter().enumerate() {
                    if i > 0 {
                        write!(f, " ")?;
                    }
                    write!(f, "{x}")?;
                }
                write!(f, ")")
            }
        }
    }
}

/// Top-level forms of a rule file (comments dropped); `None` if it does not balance.
fn parse_sexps(text: &str) -> Option<Vec<Sexp>> {
    let mut stack: Vec<Vec<Sexp>> = vec![vec![]];
    let mut atom = String::new();
    let flush = |atom: &mut String, stack: &mut Vec<Vec<Sexp>>| {
        if !atom.is_empty() {
            stack.last_mut().unwrap().push(Sexp::Atom(std::mem::take(atom)));
        }
    };
    for line in text.lines() {
        let line = line.split(';').next().unwrap();
        for ch in line.chars() {
            match ch {
                '(' => {
                    flush(&mut atom, &mut stack);
                    stack.push(vec![]);
                }
                ')' => {
                    flush(&mut atom, &mut stack);
                    let done = stack.pop()?;
                    stack.last_mut()?.push(Sexp::List(done));
                }
                c if c.is_whitespace() => flush(&mut atom, &mut stack),
                c => atom.push(c),
            }
        }
        flush(&mut atom, &mut stack);
    }
    (stack.len() == 1).then(|| stack.pop().unwrap())
}

fn subterms(x: &Sexp, out: &mut Vec<Sexp>) {
    out.push(x.clone());
    if let Sexp::List(xs) = x {
        for y in xs.iter().skip(1) {
            subterms(y, out);
        }
    }
}

fn mutate_rule(rng: &mut Rng, rule: &mut Vec<Sexp>, donors: &[Sexp]) -> &'static str {
    if rule.len() < 4 {
        return "short";
    }
    let ops = [
        "+",
        "-",
        "*",
        "/",
        "neg",
        "exp",
        "log",
        "sqrt",
        "sum",
        "amax",
        "transpose",
        "reshape",
        "softmax",
        "layernorm",
        "matmul",
        "@",
        "bogus",
    ];
    match rng.below(9) {
        0 => {
            rule.swap(2, 3);
            "swapped sides"
        }
        1 => {
            let mut vars = vec![];
            subterms(&rule[2], &mut vars);
            let pick =
                vars.into_iter().filter(|v| matches!(v, Sexp::Atom(a) if a.starts_with('?'))).collect::<Vec<_>>();
            rule[3] = if pick.is_empty() || rng.chance(30) {
                Sexp::Atom(rng.pick(&["0", "1", "-1", "2", "?zz", "1e400", "nan"]).to_string())
            } else {
                rng.pick(&pick).clone()
            };
            "unsound right side"
        }
        2 => {
            let depth = *rng.pick(&[8usize, 64, 512, 4096, 30000]);
            let side = 2 + rng.below(2);
            // Written out as text: a nested `Sexp` this deep would overflow this test's stack.
            let x = format!("{}{}{}", "(neg ".repeat(depth), rule[side], ")".repeat(depth));
            rule[side] = Sexp::Atom(x);
            "deep nesting"
        }
        3 => {
            let side = 2 + rng.below(2);
            if let Sexp::List(xs) = &mut rule[side] {
                xs[0] = Sexp::Atom(rng.pick(&ops).to_string());
            }
            "operator changed"
        }
        4 => {
            rule[3] = rng.pick(donors).clone();
            "right side from another rule"
        }
        5 => {
            rule[0] = Sexp::Atom(rng.pick(&["birewrite", "rewrite", "rule", ""]).to_string());
            "head changed"
        }
        6 => {
            let cond = rng.pick(&["bogus", "float", "positive", "last-axis", "same-shape"]).to_string();
            rule.push(Sexp::Atom(s(":if")));
            rule.push(Sexp::List(vec![Sexp::Atom(cond), Sexp::Atom(rng.pick(&["?x", "?zz", "1", "?a"]).to_string())]));
            "condition added"
        }
        7 => {
            rule[1] = Sexp::Atom(rng.pick(&["", "add-zero", "x", "é"]).to_string());
            "name changed"
        }
        _ => {
            rule.truncate(3);
            "right side dropped"
        }
    }
}

fn mutate_rules(rng: &mut Rng, c: &Corpus) -> (Vec<(String, Vec<u8>)>, &'static str) {
    let mut files: Vec<(String, String)> = c.rules.clone();
    let i = rng.below(files.len());
    let what = match rng.below(10) {
        0 => {
            files.remove(i);
            "file removed"
        }
        1 => {
            let t = &files[i].1;
            files[i].1 = if rng.chance(50) { mutate_chars(rng, t) } else { mutate_tokens(rng, t, &c.pool) };
            "text mutated"
        }
        2 => {
            files[i].1 = String::new();
            "file emptied"
        }
        _ => {
            let Some(mut forms) = parse_sexps(&files[i].1) else { return (to_files(files), "unparsed") };
            let donors: Vec<Sexp> = forms
                .iter()
                .filter_map(|f| match f {
                    Sexp::List(xs) if xs.len() > 3 => Some(xs[2].clone()),
                    _ => None,
                })
                .collect();
            let mut what = "no rule";
            for _ in 0..=rng.below(2) {
                if forms.is_empty() {
                    break;
                }
                let j = rng.below(forms.len());
                if rng.chance(10) {
                    let f = forms[j].clone();
                    forms.push(f);
                    what = "rule duplicated";
                    continue;
                }
                if let Sexp::List(rule) = &mut forms[j] {
                    what = mutate_rule(rng, rule, &donors);
                }
            }
            files[i].1 = forms.iter().map(|f| f.to_string() + "\n").collect();
            what
        }
    };
    (to_files(files), what)
}

fn to_files(files: Vec<(String, String)>) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> =
        files.into_iter().map(|(n, t)| (format!("rules/{n}"), t.into_bytes())).collect();
    if out.is_empty() {
        out.push((s("rules/.keep"), vec![]));
    }
    out
}

// --- .npy inputs

fn npy_descr(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::Bf16 => "<f4",
        DType::F16 => "<f2",
        DType::I32 => "<i4",
        DType::Bool => "|b1",
    }
}

fn npy_file(descr: &str, fortran: bool, shape: &str, data: &[u8], version: u8) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    let len_bytes = if version == 1 { 2 } else { 4 };
    let total = 10 + len_bytes - 2 + header.len() + 1;
    header += &" ".repeat((64 - total % 64) % 64);
    header.push('\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend([version, 0]);
    if version == 1 {
        out.extend((header.len() as u16).to_le_bytes());
    } else {
        out.extend((header.len() as u32).to_le_bytes());
    }
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

fn shape_tuple(shape: &[u64]) -> String {
    match shape {
        [] => s("()"),
        [a] => format!("({a},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

fn npy_data(rng: &mut Rng, descr: &str, n: usize, special: bool) -> Vec<u8> {
    let mut out = vec![];
    for _ in 0..n.min(1 << 20) {
        let f: f64 = if special {
            *rng.pick(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e38, 65504.0, 1e300, -0.0, 0.0])
        } else {
            (rng.below(2001) as f64 - 1000.0) / 250.0
        };
        match descr {
            "<f4" | ">f4" => {
                let b = (f as f32).to_bits();
                out.extend(if descr.starts_with('>') { b.to_be_bytes() } else { b.to_le_bytes() });
            }
            "<f2" => out.extend(half::f16::from_f64(f).to_bits().to_le_bytes()),
            "<f8" => out.extend(f.to_le_bytes()),
            "<i4" => out.extend((if special { i32::MIN } else { f as i32 }).to_le_bytes()),
            "<i8" => out.extend((f as i64).to_le_bytes()),
            "|b1" | "|u1" => out.push(if special { 7 } else { (f > 0.0) as u8 }),
            _ => out.extend((rng.next() as u32).to_le_bytes()),
        }
    }
    out
}

/// `.npy` files for some of a program's inputs, one or two of them wrong.
fn npy_inputs(rng: &mut Rng, p: &Program) -> (Vec<(String, Vec<u8>)>, &'static str) {
    let mut files = vec![];
    let mut what = "valid";
    let bad = if p.inputs.is_empty() { usize::MAX } else { rng.below(p.inputs.len()) };
    for (k, i) in p.inputs.iter().enumerate() {
        if k != bad && rng.chance(30) {
            continue;
        }
        let name = format!("in/{}.npy", i.name);
        let shape: Vec<u64> = i.ty.shape.iter().map(|&d| d as u64).collect();
        let n: usize = i.ty.shape.iter().product();
        let mut descr = npy_descr(i.ty.dtype).to_string();
        if k != bad || rng.chance(10) {
            let data = npy_data(rng, &descr, n, false);
            files.push((name, npy_file(&descr, false, &shape_tuple(&shape), &data, 1)));
            continue;
        }
        let (mut shape_s, mut fortran, mut version, mut special) = (shape_tuple(&shape), false, 1u8, false);
        let mut count = n;
        match rng.below(14) {
            0 => {
                descr = rng
                    .pick(&[
                        "<f8", "<i8", "|u1", "<f2", "<f4", "<i4", "|b1", ">f4", "<c8", "|V4", "<U3", "|O", "<f16", "x",
                    ])
                    .to_string();
                what = "dtype";
            }
            1 => {
                let mut sh = shape.clone();
                match rng.below(4) {
                    0 => sh.push(1),
                    1 => {
                        sh.pop();
                    }
                    2 if !sh.is_empty() => {
                        let j = rng.below(sh.len());
                        sh[j] += 1;
                    }
                    _ => sh = vec![0],
                }
                count = sh.iter().product::<u64>() as usize;
                shape_s = shape_tuple(&sh);
                what = "shape";
            }
            2 => {
                shape_s = rng
                    .pick(&[
                        "(1099511627776,)",
                        "(4294967296, 4294967296)",
                        "(-1,)",
                        "(18446744073709551615,)",
                        "[2, 3]",
                        "(2,3",
                        "()",
                        "(0,)",
                    ])
                    .to_string();
                what = "bad shape";
            }
            3 => {
                let data = npy_data(rng, &descr, n, false);
                let mut f = npy_file(&descr, false, &shape_tuple(&shape), &data, 1);
                f.truncate(rng.below(f.len()));
                files.push((name, f));
                what = "truncated";
                continue;
            }
            4 => {
                files.push((format!("{name}/.keep"), vec![]));
                what = "directory";
                continue;
            }
            5 => {
                files.push((name, vec![]));
                what = "empty";
                continue;
            }
            6 => {
                let data = npy_data(rng, &descr, n, false);
                let f = npy_file(&descr, false, &shape_tuple(&shape), &data, 1);
                let text = String::from_utf8_lossy(&f[..f.len().min(128)]).to_string();
                let mut g = mutate_chars(rng, &text).into_bytes();
                g.extend(&f[f.len().min(128)..]);
                files.push((name, g));
                what = "header mutated";
                continue;
            }
            7 => {
                fortran = true;
                what = "fortran order";
            }
            8 => {
                special = true;
                what = "non-finite values";
            }
            9 => {
                version = *rng.pick(&[2u8, 3, 9]);
                what = "version";
            }
            10 => {
                let mut f = npy_file(&descr, false, &shape_tuple(&shape), &npy_data(rng, &descr, n, false), 1);
                f[8] = 0xff;
                f[9] = 0xff;
                files.push((name, f));
                what = "header length";
                continue;
            }
            11 => {
                let mut f = npy_file(&descr, false, &shape_tuple(&shape), &npy_data(rng, &descr, n, false), 1);
                f.extend((0..1 + rng.below(16)).map(|_| rng.next() as u8));
                files.push((name, f));
                what = "trailing bytes";
                continue;
            }
            12 => {
                descr = s(">f4");
                what = "big-endian";
            }
            _ => {
                files.push((name, b"not an npy file at all".to_vec()));
                what = "garbage";
                continue;
            }
        }
        let data = npy_data(rng, &descr, count, special);
        files.push((name, npy_file(&descr, fortran, &shape_s, &data, version)));
    }
    if files.is_empty() {
        files.push((s("in/.keep"), vec![]));
    }
    (files, what)
}

// --- options

fn odd_option(rng: &mut Rng, dims: &[(String, String)], surface: &str) -> Vec<String> {
    let dim = dims.first().map(|d| d.0.clone()).unwrap_or_else(|| s("N"));
    let mut v = match rng.below(if surface == "export" { 1 } else { 8 }) {
        0 => vec![
            s("--dim"),
            rng.pick(&[
                format!("{dim}=0"),
                format!("{dim}=-1"),
                format!("{dim}=abc"),
                s("=3"),
                dim.clone(),
                format!("{dim}=18446744073709551616"),
                format!("{dim}=4294967296"),
                format!("{dim}=1099511627776"),
                format!("{dim}=2147483648"),
                s("QQ=3"),
                format!("{dim}=3=4"),
                format!("{dim}= 3"),
                s("é=2"),
                format!("{dim}=1"),
            ])
            .clone(),
        ],
        1 => vec![
            s("--time-limit"),
            rng.pick(&[
                "0",
                "-1",
                "nan",
                "NaN",
                "inf",
                "1e-9",
                "1e300",
                "abc",
                "",
                "1e-320",
                "0.001",
                "18446744073709551616",
            ])
            .to_string(),
        ],
        2 => vec![
            s("--node-limit"),
            rng.pick(&["0", "1", "2", "10", "-1", "18446744073709551615", "99999999999999999999", "x"]).to_string(),
        ],
        3 => vec![
            s("--memory-budget"),
            rng.pick(&[
                "0",
                "1",
                "1B",
                "1KB",
                "512MiB",
                "1e30GB",
                "-5",
                "abc",
                "NaN",
                "inf",
                "1.5GB",
                "18446744073709551615",
                "99999999999TB",
                "",
                "1e-9",
                "0.5",
                "1 GB",
                "1GiB",
            ])
            .to_string(),
        ],
        4 => vec![
            s("--device"),
            rng.pick(&["h300", "", "/nonexistent.json", ".", "prog.eqf", "H100", "h200"]).to_string(),
        ],
        5 => vec![s("--rules"), rng.pick(&["/nonexistent", ".", "prog.eqf", ""]).to_string()],
        6 => vec![s("--extractor"), rng.pick(&["ilp", "greedy", "foo"]).to_string()],
        _ => vec![s("--format"), rng.pick(&["yaml", "", "json", "dot", "text"]).to_string()],
    };
    if v[0] == "--format" && surface != "optimize" {
        v = vec![s("--strict")];
    }
    v
}

// --- one input

const ORIGINS: &[(&str, usize)] = &[
    ("eqf-corpus", 20),
    ("eqf-generated", 14),
    ("eqf-illtyped", 7),
    ("json-graph", 14),
    ("onnx", 12),
    ("profile", 10),
    ("rules", 8),
    ("npy", 9),
    ("options", 6),
    ("deep", 1),
];

fn weighted<'a>(rng: &mut Rng, xs: &[(&'a str, usize)]) -> &'a str {
    let total: usize = xs.iter().map(|x| x.1).sum();
    let mut r = rng.below(total);
    for (x, w) in xs {
        if r < *w {
            return x;
        }
        r -= w;
    }
    unreachable!()
}

fn generate(seed: u64, index: usize, c: &Corpus) -> Input {
    let mut rng = Rng((seed ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
    for _ in 0..4 {
        rng.next();
    }
    let origin = weighted(&mut rng, ORIGINS);
    let mut prog = match origin {
        "eqf-corpus" => corpus_prog(&mut rng, c),
        "eqf-generated" => generated(&mut rng),
        "eqf-illtyped" => illtyped_prog(&mut rng, c),
        "json-graph" => json_prog(&mut rng, c),
        "onnx" => onnx_prog(&mut rng, c),
        "deep" => deep_prog(&mut rng),
        _ => valid_prog(&mut rng, c),
    };
    let surfaces: &[(&str, usize)] = match origin {
        "npy" => &[("run", 1)],
        "profile" | "rules" => &[("optimize", 50), ("codegen", 25), ("explain", 15), ("run", 10)],
        "deep" if prog.big => &[("export", 50), ("run", 50)],
        _ if prog.big => &[("optimize", 50), ("export", 40), ("explain", 10)],
        // Planning costs 50-300 ms a run in a debug build, loading and `run --cpu` a few: the
        // planning surfaces get fewer inputs, so that CI's 10,000 take a few minutes.
        _ => &[("optimize", 26), ("codegen", 13), ("export", 25), ("run", 28), ("explain", 8)],
    };
    let surface = weighted(&mut rng, surfaces);
    let mut files = vec![];
    let mut args = vec![s(surface)];
    let mut origin = origin.to_string();
    let mut stdin = None;
    let prog_arg = if prog.file.ends_with(".eqf") && rng.chance(3) {
        stdin = Some(std::mem::take(&mut prog.bytes));
        s("-")
    } else {
        files.push((prog.file.clone(), std::mem::take(&mut prog.bytes)));
        prog.file.clone()
    };
    args.push(prog_arg);
    match surface {
        "optimize" => {
            let fmt = *rng.pick(&["json", "json", "json", "table", "text", "dot"]);
            args.extend([s("--format"), s(fmt)]);
        }
        "codegen" => args.extend([s("-o"), s("gen")]),
        "run" => args.extend([s("--cpu"), s("--outputs"), s("out")]),
        _ => {}
    }
    for (n, v) in &prog.dims {
        args.extend([s("--dim"), format!("{n}={v}")]);
    }
    // `run --cpu` refuses the planning options (exit 2): one run input in ten gets them, to
    // check that refusal; the others run the program (with them all, only about 1 in 80 did).
    if surface != "export" && (surface != "run" || rng.chance(10)) {
        // Small budgets for most runs, the defaults for some.
        if rng.chance(85) {
            args.extend([s("--node-limit"), rng.pick(&["100", "200", "200", "500", "1000", "2000"]).to_string()]);
        }
        if rng.chance(85) {
            args.extend([s("--time-limit"), rng.pick(&["0.1", "0.1", "0.3"]).to_string()]);
        }
        if rng.chance(8) {
            args.push(s("--strict"));
        }
        if rng.chance(5) {
            args.push(s("--no-fusion"));
        }
        if rng.chance(3) && surface != "run" {
            args.extend([s("--extractor"), s("ilp")]);
        }
        if rng.chance(4) {
            args.extend([s("--memory-budget"), rng.pick(&["1KB", "64KB", "1MiB", "1GB"]).to_string()]);
        }
    }
    match origin.as_str() {
        "profile" => {
            files.push((s("profile.json"), mutate_profile(&mut rng, c)));
            args.extend([s("--device"), s("profile.json")]);
        }
        "rules" => {
            let (rule_files, what) = mutate_rules(&mut rng, c);
            files.extend(rule_files);
            args.extend([s("--rules"), s("rules")]);
            origin = format!("rules ({what})");
        }
        "npy" => {
            if let Some(p) = &prog.program {
                let (npy, what) = npy_inputs(&mut rng, p);
                files.extend(npy);
                origin = format!("npy ({what})");
            } else {
                files.push((s("in/.keep"), vec![]));
            }
            args.extend([s("--inputs"), s("in")]);
            if rng.chance(10) {
                args.extend([s("--seed"), rng.pick(&["1", "18446744073709551615"]).to_string()]);
            }
        }
        "options" => {
            for _ in 0..=rng.below(2) {
                args.extend(odd_option(&mut rng, &prog.dims, surface));
            }
        }
        _ => {}
    }
    Input { origin, files, args, stdin, timeout: None }
}

// ---------------------------------------------------------------------------------------------
// Running and judging

struct Outcome {
    code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    stdout: Vec<u8>,
    stderr: String,
}

fn exec(dir: &Path, args: &[String], stdin: Option<&[u8]>, timeout: Duration) -> Outcome {
    let io = dir.join(".fuzz");
    fs::create_dir_all(&io).unwrap();
    let (out_path, err_path) = (io.join("stdout"), io.join("stderr"));
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {MEM_LIMIT_KB} 2>/dev/null; exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .current_dir(dir)
        .env("RAYON_NUM_THREADS", "1")
        .env("RUST_BACKTRACE", "1")
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap());
    match stdin {
        Some(b) => {
            let p = io.join("stdin");
            fs::write(&p, b).unwrap();
            cmd.stdin(fs::File::open(p).unwrap());
        }
        None => {
            cmd.stdin(Stdio::null());
        }
    }
    let mut child = cmd.spawn().expect("spawn the eqfuse binary");
    let start = Instant::now();
    let mut nap = Duration::from_millis(1);
    let (status, timed_out) = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break (Some(st), false);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    };
    Outcome {
        code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        timed_out,
        stdout: fs::read(&out_path).unwrap_or_default(),
        stderr: String::from_utf8_lossy(&fs::read(&err_path).unwrap_or_default()).to_string(),
    }
}

/// A failure: its class (for grouping) and what was seen.
struct Failure {
    class: String,
    detail: String,
}

fn fail(class: impl Into<String>, detail: impl Into<String>) -> Failure {
    Failure { class: class.into(), detail: detail.into() }
}

/// Digits to `N`, so messages that differ only in numbers group together.
fn normalize(m: &str) -> String {
    let mut out = String::new();
    let mut prev_digit = false;
    for ch in m.chars() {
        if ch.is_ascii_digit() {
            if !prev_digit {
                out.push('N');
            }
            prev_digit = true;
        } else {
            out.push(ch);
            prev_digit = false;
        }
    }
    out
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        _ => "signal",
    }
}

/// Plans, NVRTC sources and export checks share this.
struct Shared {
    timeout: Duration,
    sources: Mutex<BTreeMap<u64, (String, String, Input)>>,
}

/// Whether stderr holds a panic's message (`thread 'main' panicked at src/...`, a thread id
/// between the name and `panicked` in newer Rust). Not the bare word: an error quoting the
/// line it points at quotes the program, and a program's comment may say "panicked" (a
/// mutated case file of `tests/cases/ok` did, and exited 1 with its error as it should).
fn panicked(stderr: &str) -> bool {
    stderr.lines().any(|l| l.starts_with("thread '") && l.contains(" panicked at "))
}

fn judge(input: &Input, o: &Outcome, dir: &Path, shared: &Shared) -> Result<(), Failure> {
    let surface = input.surface();
    if o.timed_out {
        let limit = input.timeout.unwrap_or(shared.timeout);
        return Err(fail(format!("hang: {surface} ran past {limit:?}"), tail(&o.stderr)));
    }
    if let Some(sig) = o.signal {
        let what = o
            .stderr
            .lines()
            .find(|l| l.contains("overflowed its stack") || l.contains("memory allocation") || l.contains("fatal"))
            .map(|l| normalize(l.trim()))
            .unwrap_or_default();
        return Err(fail(format!("abort: {} ({sig}) {what}", signal_name(sig)), tail(&o.stderr)));
    }
    match o.code {
        Some(0) => check_output(input, o, dir, shared),
        Some(1) if o.stderr.contains("error:") && !panicked(&o.stderr) => Ok(()),
        Some(1) => Err(fail("exit 1 without `error:` on stderr", tail(&o.stderr))),
        Some(2) if !o.stderr.trim().is_empty() => Ok(()),
        Some(101) if o.stderr.contains("panicked") => {
            let at = o
                .stderr
                .lines()
                .find_map(|l| l.split_once("panicked at ").map(|(_, r)| r.trim_end_matches(':').to_string()))
                .unwrap_or_default();
            // `src/x.rs:12:5` → `src/x.rs:12`; a panic inside the standard library (an overflow in
            // `Iterator::product`) is placed at the first frame of eqfuse's own code.
            let strip = |a: &str| a.rsplit_once(':').map_or(a.to_string(), |(a, _)| a.to_string());
            let own = o
                .stderr
                .lines()
                .filter_map(|l| l.trim().strip_prefix("at "))
                .filter(|l| !l.contains("/rustc/") && !l.contains("/.cargo/") && !l.contains("/tests/"))
                .find_map(|l| l.find("src/").map(|i| l[i..].to_string()));
            let place = match own {
                Some(frame) if !at.starts_with("src/") => {
                    let std_file = strip(&at).rsplit('/').next().unwrap_or("").to_string();
                    format!("{} (in std {std_file})", strip(&frame))
                }
                _ => strip(&at),
            };
            let msg = o.stderr.lines().skip_while(|l| !l.contains("panicked at ")).nth(1).unwrap_or("").trim();
            Err(fail(format!("panic at {place}: {}", head_chars(&normalize(msg), 90)), tail(&o.stderr)))
        }
        Some(c) => Err(fail(format!("exit {c}"), tail(&o.stderr))),
        None => Err(fail("no exit status", tail(&o.stderr))),
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

fn check_output(input: &Input, o: &Outcome, dir: &Path, shared: &Shared) -> Result<(), Failure> {
    let surface = input.surface();
    let bad = |what: String| fail(format!("bad output: {surface}: {}", head_chars(&normalize(&what), 100)), what);
    match surface {
        "optimize" => match input.flag("--format").unwrap_or("table") {
            "json" => {
                let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| bad(format!("plan is not JSON: {e}")))?;
                plan_contract(&v).map_err(|e| bad(format!("plan contract: {e}")))
            }
            _ if o.stdout.is_empty() => Err(bad(s("nothing printed"))),
            _ => Ok(()),
        },
        "explain" if o.stdout.is_empty() => Err(bad(s("nothing printed"))),
        "explain" => Ok(()),
        "export" => {
            let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| bad(format!("export is not JSON: {e}")))?;
            if v.get("schema").and_then(Value::as_str) != Some("eqfuse.graph/1") {
                return Err(bad(s("export has no `schema: eqfuse.graph/1`")));
            }
            fs::write(dir.join("exported.json"), &o.stdout).unwrap();
            let again = exec(dir, &[s("export"), s("exported.json")], None, shared.timeout);
            if again.code != Some(0) {
                return Err(fail(
                    format!(
                        "bad output: export: its own export does not read back (exit {:?}, signal {:?})",
                        again.code, again.signal
                    ),
                    tail(&again.stderr),
                ));
            }
            let w: Value =
                serde_json::from_slice(&again.stdout).map_err(|e| bad(format!("re-export is not JSON: {e}")))?;
            if strip_source(&v) != strip_source(&w) {
                return Err(bad(s("export of the export differs from the export")));
            }
            Ok(())
        }
        "codegen" => {
            let out = dir.join(input.flag("-o").unwrap_or("gen"));
            let plan: Value = fs::read(out.join("plan.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .ok_or_else(|| bad(s("no readable plan.json")))?;
            plan_contract(&plan).map_err(|e| bad(format!("plan.json contract: {e}")))?;
            let launch: Option<Value> =
                fs::read(out.join("launch.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
            if launch.is_none() {
                return Err(bad(s("no readable launch.json")));
            }
            let mut cus: Vec<PathBuf> = read_dir_sorted(&out, "cu");
            cus.sort();
            for cu in cus {
                let text = fs::read_to_string(&cu).map_err(|e| bad(format!("{}: {e}", cu.display())))?;
                if text.trim().is_empty() {
                    return Err(bad(s("an empty .cu file")));
                }
                let name = cu.file_name().unwrap().to_string_lossy().to_string();
                shared
                    .sources
                    .lock()
                    .unwrap()
                    .entry(fnv(text.as_bytes()))
                    .or_insert_with(|| (name, text, input.clone()));
            }
            Ok(())
        }
        "run --cpu" => {
            let out = dir.join(input.flag("--outputs").unwrap_or("eqfuse-out"));
            let files = read_dir_sorted(&out, "npy");
            if files.is_empty() {
                return Err(bad(s("no .npy written")));
            }
            for f in files {
                read_npy_fully(&f).map_err(|e| {
                    let file = f.file_name().unwrap().to_string_lossy().to_string();
                    fail(
                        format!("bad output: run --cpu: an .npy npyz cannot read: {}", normalize(&e)),
                        format!("{file}: {e}"),
                    )
                })?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The export without the fields that name where it came from.
fn strip_source(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("source");
        m.remove("name");
        m.remove("program");
    }
    v
}

fn read_npy_fully(path: &Path) -> Result<(), String> {
    let bytes = fs::read(path).map_err(|e| e.to_string())?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| e.to_string())?;
    let n: u64 = npy.shape().iter().product();
    let descr = npy.dtype().descr();
    let got = match descr.trim_matches('\'') {
        "<f4" => npy.into_vec::<f32>().map(|v| v.len()),
        "<f2" => npy.into_vec::<half::f16>().map(|v| v.len()),
        "<f8" => npy.into_vec::<f64>().map(|v| v.len()),
        "<i4" => npy.into_vec::<i32>().map(|v| v.len()),
        "|b1" => npy.into_vec::<bool>().map(|v| v.len()),
        other => return Err(format!("unexpected dtype {other}")),
    }
    .map_err(|e| e.to_string())?;
    if got as u64 != n {
        return Err(format!("{got} values for shape {:?}", npy_shape(&bytes)));
    }
    Ok(())
}

fn npy_shape(bytes: &[u8]) -> Vec<u64> {
    npyz::NpyFile::new(bytes).map(|n| n.shape().to_vec()).unwrap_or_default()
}

/// The fields of docs/plan-schema.md, with their types, and the totals' sums.
fn plan_contract(v: &Value) -> Result<(), String> {
    let field = |o: &Value, k: &str| o.get(k).cloned().ok_or_else(|| format!("missing `{k}`"));
    let uint = |o: &Value, k: &str| field(o, k)?.as_u64().ok_or_else(|| format!("`{k}` is not an unsigned integer"));
    let num = |o: &Value, k: &str| {
        field(o, k)?.as_f64().filter(|x| x.is_finite()).ok_or_else(|| format!("`{k}` is not a finite number"))
    };
    let string =
        |o: &Value, k: &str| field(o, k)?.as_str().map(String::from).ok_or_else(|| format!("`{k}` is not a string"));
    let strings = |o: &Value, k: &str| -> Result<(), String> {
        let a = field(o, k)?;
        let a = a.as_array().ok_or_else(|| format!("`{k}` is not a list"))?;
        a.iter().all(Value::is_string).then_some(()).ok_or_else(|| format!("`{k}` is not a list of strings"))
    };
    if string(v, "schema")? != "eqfuse.plan/1" {
        return Err(s("schema is not eqfuse.plan/1"));
    }
    string(v, "program")?;
    string(v, "device")?;
    let kernels = field(v, "kernels")?;
    let kernels = kernels.as_array().ok_or("`kernels` is not a list")?;
    let (mut bytes, mut flops) = (0u64, 0u64);
    for (i, k) in kernels.iter().enumerate() {
        if uint(k, "id")? != i as u64 {
            return Err(format!("kernel {i} has id {}", k["id"]));
        }
        let t = string(k, "template")?;
        if !["elementwise", "rowreduce", "colreduce", "gemm", "attention"].contains(&t.as_str()) {
            return Err(format!("kernel {i}: template `{t}`"));
        }
        strings(k, "ops")?;
        strings(k, "reads")?;
        strings(k, "writes")?;
        bytes = bytes.saturating_add(uint(k, "bytes_read")?).saturating_add(uint(k, "bytes_written")?);
        flops = flops.saturating_add(uint(k, "flops")?);
        num(k, "predicted_us").map_err(|e| format!("kernel {i}: {e}"))?;
    }
    let total = field(v, "total")?;
    if uint(&total, "kernels")? != kernels.len() as u64 {
        return Err(s("total.kernels is not the number of kernels"));
    }
    if uint(&total, "bytes")? != bytes {
        return Err(format!("total.bytes {} is not the kernels' sum {bytes}", total["bytes"]));
    }
    if uint(&total, "flops")? != flops {
        return Err(format!("total.flops {} is not the kernels' sum {flops}", total["flops"]));
    }
    num(&total, "predicted_us").map_err(|e| format!("total: {e}"))?;
    let unfused = field(v, "unfused")?;
    uint(&unfused, "kernels")?;
    uint(&unfused, "bytes")?;
    num(&unfused, "predicted_us").map_err(|e| format!("unfused: {e}"))?;
    let search = field(v, "search")?;
    for k in ["iterations", "enodes", "eclasses"] {
        uint(&search, k)?;
    }
    let stop = string(&search, "stop_reason")?;
    if !["saturated", "iteration-limit", "node-limit", "time-limit", "other"].contains(&stop.as_str()) {
        return Err(format!("stop_reason `{stop}`"));
    }
    num(&search, "saturate_ms")?;
    num(&search, "extract_ms")?;
    string(&search, "extractor")?;
    let gap = field(&search, "gap")?;
    if !(gap.is_null() || gap.as_f64().is_some_and(f64::is_finite)) {
        return Err(s("search.gap is neither null nor a finite number"));
    }
    for k in ["inputs", "outputs"] {
        field(v, k)?.as_array().ok_or_else(|| format!("`{k}` is not a list"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Kept cases

fn load_case(dir: &Path) -> Input {
    let cmd = fs::read_to_string(dir.join("cmd")).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let args: Vec<String> = cmd.lines().filter(|l| !l.starts_with('#')).map(String::from).collect();
    let mut files = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().to_string();
                if rel != "cmd" && rel != "stdin" {
                    files.push((rel, fs::read(&p).unwrap()));
                }
            }
        }
    }
    files.sort();
    let stdin = fs::read(dir.join("stdin")).ok();
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let timeout = cmd
        .lines()
        .find_map(|l| l.strip_prefix("# timeout:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(Duration::from_secs_f64);
    Input { origin: format!("kept {name}"), files, args, stdin, timeout }
}

fn kept_cases() -> Vec<Input> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(cases_dir())
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.iter().map(|d| load_case(d)).collect()
}

/// Writes a failing input as `tests/cases/fuzz_cli/<hash>/`; returns its folder.
fn save_case(input: &Input, f: &Failure) -> PathBuf {
    let dir = cases_dir().join(format!("{:016x}", input.hash()));
    input.materialize(&dir).unwrap();
    if let Some(b) = &input.stdin {
        fs::write(dir.join("stdin"), b).unwrap();
    }
    let mut cmd = format!(
        "# fuzz_cli case: the arguments of `eqfuse`, one a line, run in this folder{}\n# origin: {}\n# failed: {}\n",
        if input.stdin.is_some() { " with `stdin` as standard input" } else { "" },
        input.origin,
        f.class.replace('\n', " ")
    );
    for a in &input.args {
        cmd += a;
        cmd.push('\n');
    }
    fs::write(dir.join("cmd"), cmd).unwrap();
    dir
}

// ---------------------------------------------------------------------------------------------
// The test

#[derive(Default)]
struct Stats {
    inputs: usize,
    per_surface: BTreeMap<String, BTreeMap<String, usize>>,
    per_origin: BTreeMap<String, BTreeMap<String, usize>>,
    exit_codes: BTreeMap<String, usize>,
    /// Seconds spent per surface and per origin.
    secs: BTreeMap<String, f64>,
    /// The slowest runs: seconds and command.
    slowest: Vec<(f64, String)>,
    /// Class → (count, surfaces and origins, first example, its detail).
    failures: BTreeMap<String, (usize, BTreeSet<String>, Input, String)>,
    kept_failed: Vec<String>,
}

fn exit_label(o: &Outcome) -> String {
    if o.timed_out {
        s("timeout")
    } else if let Some(sig) = o.signal {
        format!("signal {sig}")
    } else {
        o.code.map_or(s("?"), |c| c.to_string())
    }
}

fn run_one(input: &Input, shared: &Shared, stats: &Mutex<Stats>) {
    let scratch = tempfile::Builder::new().prefix("eqfuse-fuzz-").tempdir().unwrap();
    input.materialize(scratch.path()).unwrap();
    let t0 = Instant::now();
    let o = exec(scratch.path(), &input.args, input.stdin.as_deref(), input.timeout.unwrap_or(shared.timeout));
    let verdict = judge(input, &o, scratch.path(), shared);
    let took = t0.elapsed().as_secs_f64();
    let mut st = stats.lock().unwrap();
    *st.secs.entry(input.surface().to_string()).or_default() += took;
    st.slowest.push((took, format!("{} [{}]", input.command_line(), input.origin)));
    st.slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    st.slowest.truncate(12);
    *st.secs.entry(format!("origin {}", input.origin.split(' ').next().unwrap())).or_default() += took;
    st.inputs += 1;
    let label = exit_label(&o);
    *st.per_surface.entry(input.surface().into()).or_default().entry(label.clone()).or_default() += 1;
    let origin = input.origin.split(' ').next().unwrap().to_string();
    *st.per_origin.entry(origin).or_default().entry(label.clone()).or_default() += 1;
    *st.exit_codes.entry(label).or_default() += 1;
    if let Err(f) = verdict {
        record(&mut st, input, f);
    }
}

fn record(st: &mut Stats, input: &Input, f: Failure) {
    if input.origin.starts_with("kept") {
        st.kept_failed.push(format!("{}: {}", input.origin, f.class));
    }
    let e = st.failures.entry(f.class).or_insert_with(|| (0, BTreeSet::new(), input.clone(), f.detail));
    e.0 += 1;
    e.1.insert(input.surface().to_string());
    e.1.insert(format!("from {}", input.origin.split(' ').next().unwrap_or("")));
}

fn parallel(n: usize, workers: usize, f: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for _ in 0..workers {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                f(i);
            });
        }
    });
}

fn nvrtc_check(shared: &Shared, stats: &Mutex<Stats>, workers: usize) -> String {
    let max = env_or("EQFUSE_FUZZ_NVRTC_MAX", 200) as usize;
    let sources: Vec<(u64, (String, String, Input))> =
        shared.sources.lock().unwrap().iter().map(|(k, v)| (*k, v.clone())).collect();
    if let Err(why) = eqfuse::nvrtc_available() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI=true but NVRTC is unusable: {why}");
        }
        return format!(
            "NVRTC: skipped, not available ({why}); {} unique .cu sources not compiled (eval \"$(.ci/install-nvrtc)\")",
            sources.len()
        );
    }
    // The sources with the smallest hashes: a deterministic sample spread over the inputs.
    let sample: Vec<&(u64, (String, String, Input))> = sources.iter().take(max).collect();
    let compiled = AtomicUsize::new(0);
    parallel(sample.len(), workers, |i| {
        let (_, (file, text, input)) = sample[i];
        match eqfuse::nvrtc_compile(text, file, eqfuse::DEFAULT_ARCH, &[]) {
            Ok(_) => {
                compiled.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let msg = e.to_string();
                let first = msg.lines().find(|l| l.contains("error")).unwrap_or(&msg).to_string();
                let f = fail(format!("nvrtc: {}", head_chars(&normalize(&first), 100)), format!("{file}:\n{msg}"));
                record(&mut stats.lock().unwrap(), input, f);
            }
        }
    });
    format!(
        "NVRTC: compiled {} of {} unique .cu sources ({} sampled)",
        compiled.into_inner(),
        sources.len(),
        sample.len()
    )
}

#[test]
fn cli_survives_fuzzed_inputs() {
    let start = Instant::now();
    let report_mode = std::env::var("EQFUSE_FUZZ_REPORT").is_ok_and(|v| v != "0" && !v.is_empty());
    let n = env_or("EQFUSE_FUZZ_CASES", 1_000) as usize;
    let seed = env_or("EQFUSE_FUZZ_SEED", 0x5eed_f022_c11a_0001);
    let default_workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 4);
    let workers = env_or("EQFUSE_FUZZ_WORKERS", default_workers as u64).max(1) as usize;
    let shared = Shared {
        // A hang is a run past a minute: a rules folder given on the command line is
        // soundness-checked rule by rule on load (about 15 s of a debug build on an idle core),
        // which a loaded two-core machine stretched past 30 s.
        timeout: Duration::from_secs(env_or("EQFUSE_FUZZ_TIMEOUT", 60)),
        sources: Mutex::new(BTreeMap::new()),
    };
    let stats = Mutex::new(Stats::default());

    // Under CI=true a missing NVRTC fails at once (nvrtc_check says so again at the end).
    if std::env::var("CI").as_deref() == Ok("true") {
        if let Err(why) = eqfuse::nvrtc_available() {
            panic!("CI=true but NVRTC is unusable: {why}");
        }
    }
    let kept = kept_cases();
    parallel(kept.len(), workers, |i| run_one(&kept[i], &shared, &stats));
    let kept_secs = start.elapsed().as_secs_f64();

    let corpus = load_corpus();
    assert!(corpus.small.len() >= 10 && corpus.graphs.len() >= 10 && corpus.onnx.len() >= 5, "the corpus is there");
    parallel(n, workers, |i| {
        run_one(&generate(seed, i, &corpus), &shared, &stats);
        if (i + 1) % 1000 == 0 {
            eprintln!("fuzz_cli: {} inputs, {:.0?}", i + 1, start.elapsed());
        }
    });
    let nvrtc = nvrtc_check(&shared, &stats, workers);

    let st = stats.into_inner().unwrap();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "fuzz_cli: {} inputs ({} kept cases in {kept_secs:.1}s, {n} generated, seed {seed:#x}) in {secs:.1}s with {workers} workers",
        st.inputs,
        kept.len()
    );
    println!("exit codes: {:?}", st.exit_codes);
    for (surface, codes) in &st.per_surface {
        println!("  {surface:<10} {:>6} inputs, exits {codes:?}", codes.values().sum::<usize>());
    }
    for (origin, codes) in &st.per_origin {
        println!("  from {origin:<14} {:>6} inputs, exits {codes:?}", codes.values().sum::<usize>());
    }
    println!("{nvrtc}");
    let secs_by: Vec<String> = st.secs.iter().map(|(k, v)| format!("{k} {v:.1}s")).collect();
    println!("run time by surface and origin: {}", secs_by.join(", "));
    for (secs, cmd) in &st.slowest {
        println!("  slow: {secs:.2}s {cmd}");
    }
    let total_failures: usize = st.failures.values().map(|f| f.0).sum();
    if !st.failures.is_empty() {
        println!("\n{total_failures} failures in {} classes:", st.failures.len());
        println!("{:>6}  {:<80}  surfaces / example", "count", "class");
        for (class, (count, surfaces, example, _)) in &st.failures {
            let surfaces: Vec<&str> = surfaces.iter().map(String::as_str).collect();
            println!("{count:>6}  {class:<80}  [{}]\n{:>88}{}", surfaces.join(", "), "", example.command_line());
        }
    }
    // Every generated surface must accept some inputs, or the fuzzer tests little.
    for surface in ["optimize", "codegen", "export", "run --cpu", "explain"] {
        let ok = st.per_surface.get(surface).and_then(|c| c.get("0")).copied().unwrap_or(0);
        assert!(n < 500 || ok > 0, "no {surface} input ran to exit 0");
    }
    // The first input of each class not yet kept is written to tests/cases/fuzz_cli/: by default
    // in CI mode, and in report mode with EQFUSE_FUZZ_SAVE=1.
    let save = env_or("EQFUSE_FUZZ_SAVE", u64::from(!report_mode)) != 0;
    let mut shown = String::new();
    for (class, (count, _, example, detail)) in &st.failures {
        let saved = if save && !example.origin.starts_with("kept") {
            format!("saved as {}\n", save_case(example, &fail(class.clone(), "")).display())
        } else {
            String::new()
        };
        shown +=
            &format!("\n=== {class} ({count} inputs)\n{saved}{}--- stderr / detail\n{detail}\n", example.describe());
    }
    if report_mode {
        if save {
            println!("{shown}");
        }
        return;
    }
    if st.failures.is_empty() {
        return;
    }
    panic!(
        "{total_failures} of {} inputs failed ({} classes; kept cases failing: {}):{shown}",
        st.inputs,
        st.failures.len(),
        st.kept_failed.len()
    );
}
