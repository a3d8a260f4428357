//! Front-end tests: precedence, every builtin, dim overrides, the example programs, the JSON
//! round trip, and the `tests/cases/err` harness (each case names its error's place and text).

use std::fs;
use std::path::{Path, PathBuf};

use egg::Id;
use eqfuse::{
    load_program, parse_dim_override, parse_program, program_from_json, program_to_json, Error, Kind, OpCode, Program,
    TensorLang, Unary, OPS,
};

/// The expression of one node as an s-expression (children expanded).
fn sexpr(p: &Program, id: Id) -> String {
    match p.node(id) {
        TensorLang::Op(code, ch) => {
            let args: Vec<String> = ch.iter().map(|&c| sexpr(p, c)).collect();
            format!("({} {})", code.name(), args.join(" "))
        }
        leaf => leaf.to_string(),
    }
}

/// Parses `y = EXPR` over scalar-free f32 inputs `a b c d e x y` of shape [4, 4].
fn expr(src: &str) -> String {
    let decls: String = "abcdexy".chars().map(|c| format!("input {c}: f32[4, 4]\n")).collect();
    let text = format!("{decls}out = {src}\noutput out\n");
    let p = parse_program("t.eqf", &text, &[]).unwrap_or_else(|e| panic!("{src}: {e}"));
    sexpr(&p, p.outputs[0].id)
}

fn error_of(text: &str) -> String {
    parse_program("t.eqf", text, &[]).expect_err("should fail").to_string()
}

#[test]
fn precedence() {
    assert_eq!(expr("a + b * c ^ d ^ e"), "(+ a (* b (pow c (pow d e))))");
    assert_eq!(expr("a - b - c"), "(- (- a b) c)");
    assert_eq!(expr("a / b * c"), "(* (/ a b) c)");
    assert_eq!(expr("(a + b) * c"), "(* (+ a b) c)");
    assert_eq!(expr("a + b < c * d"), "(< (+ a b) (* c d))");
}

#[test]
fn unary_minus_and_power() {
    assert_eq!(expr("-x ^ 2"), "(neg (pow x 2))");
    assert_eq!(expr("-x * y"), "(* (neg x) y)");
    assert_eq!(expr("x ^ -y"), "(pow x (neg y))");
    assert_eq!(expr("x * -3"), "(* x -3)");
    // Literals fold: `-2 ^ 2` is `-(2 ^ 2)` as in Python, and `2 ^ -1` is one half.
    assert_eq!(expr("x * -2 ^ 2"), "(* x -4)");
    assert_eq!(expr("x * 2 ^ -1"), "(* x 0.5)");
    assert_eq!(expr("--x"), "(neg (neg x))");
}

#[test]
fn matmul_binds_like_multiplication() {
    assert_eq!(expr("a @ b * c"), "(* (@ a b) c)");
    assert_eq!(expr("a * b @ c"), "(@ (* a b) c)");
    assert_eq!(expr("a + b @ c"), "(+ a (@ b c))");
    assert_eq!(expr("a @ b ^ 2"), "(@ a (pow b 2))");
}

#[test]
fn operators_map_to_the_op_table() {
    for op in ["+", "-", "*", "/", "@", "<", "<=", ">", ">=", "==", "!="] {
        assert_eq!(expr(&format!("x {op} y")), format!("({op} x y)"));
    }
    assert_eq!(expr("x ^ y"), "(pow x y)");
}

/// A call exercising `op` over inputs `x, y: f32[4, 8]`, `r: f32[8]`, `t: i32[4]`.
fn call_for(name: &str, kind: Kind) -> String {
    use eqfuse::Composite as C;
    match kind {
        Kind::Unary(Unary::Not) => "not(x > y)".to_string(),
        Kind::Unary(_) => format!("{name}(x)"),
        Kind::Binary(_) if name.chars().all(char::is_alphabetic) => format!("{name}(x, y)"),
        Kind::Binary(_) => format!("x {name} y"),
        Kind::Reduce(_) | Kind::Composite(C::Softmax | C::LogSoftmax) => format!("{name}(x, -1)"),
        Kind::Where => "where(x > y, x, y)".to_string(),
        Kind::Cast => "cast(x, bf16)".to_string(),
        Kind::Transpose => "transpose(x, 0, -1)".to_string(),
        Kind::Reshape => "reshape(x, [2, N, 4])".to_string(),
        Kind::Broadcast => "broadcast(r, [3, 4, 8])".to_string(),
        Kind::MatMul => "x @ transpose(y, 0, 1)".to_string(),
        Kind::Iota => "iota(N)".to_string(),
        Kind::OneHot => "onehot(t, 10)".to_string(),
        Kind::Dropout => "dropout(x, 0.5, 3)".to_string(),
        Kind::Grad => "grad(sum(sum(x, 0), 1), x)".to_string(),
        Kind::Gather => "gather(x, t, 1)".to_string(),
        Kind::ScatterAdd => "scatter_add(t, x, 0, 6)".to_string(),
        Kind::Slice => "slice(x, -1, 2, N, 1)".to_string(),
        Kind::Concat => "concat(x, y, 0)".to_string(),
        Kind::Composite(C::LayerNorm) => "layernorm(x, r, r, 1e-5)".to_string(),
        Kind::Composite(C::RmsNorm) => "rmsnorm(x, r, 1e-6)".to_string(),
        Kind::Composite(C::CrossEntropy) => "cross_entropy(x, t)".to_string(),
        Kind::Composite(C::Attention) => "attention(x, y, y, 0.5, 1)".to_string(),
        Kind::Composite(C::AttentionBias) => "attention_bias(x, y, y, sum(x, -1), 0.5, 1)".to_string(),
        Kind::Composite(C::AttentionLse) => "attention_lse(x, y, 0.5, 1)".to_string(),
        Kind::Composite(C::AttentionGrad(_)) => format!("{name}(x, y, y, x, sum(x, -1), sum(y, -1), 0.5, 1)"),
        Kind::Composite(C::AttentionBiasLse) => "attention_bias_lse(x, y, sum(x, -1), 0.5, 1)".to_string(),
        Kind::Composite(C::AttentionBiasGrad(_)) => format!(
            "{name}(x, y, y, x, concat(sum(x, -1), sum(x, -1), -1), sum(y, -1), x @ transpose(y, 0, 1), 0.5, 1)"
        ),
        Kind::Composite(C::AttentionDropout) => "attention_dropout(x, y, y, 0.5, 1, 0.1, 7)".to_string(),
        Kind::Composite(C::AttentionBiasDropout) => {
            "attention_bias_dropout(x, y, y, sum(x, -1), 0.5, 1, 0.1, slice(t, 0, 0, 1, 1))".to_string()
        }
        Kind::Composite(C::AttentionDropoutGrad(_)) => {
            format!("{name}(x, y, y, x, sum(x, -1), sum(y, -1), 0.5, 1, 0.25, 3)")
        }
        Kind::Composite(C::AttentionBiasDropoutGrad(_)) => format!(
            "{name}(x, y, y, x, concat(sum(x, -1), sum(x, -1), -1), sum(y, -1), x @ transpose(y, 0, 1), 0.5, 1, 0.5, \
             reshape(slice(t, 0, 1, 2, 1), []))"
        ),
    }
}

#[test]
fn every_builtin_parses() {
    let head = "dim N = 4\ninput x: f32[4, 8]\ninput y: f32[4, 8]\ninput r: f32[8]\ninput t: i32[4]\n";
    for op in OPS {
        let text = format!("{head}out = {}\noutput out\n", call_for(op.name, op.kind));
        let p = parse_program("t.eqf", &text, &[]).unwrap_or_else(|e| panic!("{}: {e}", op.name));
        if op.kind == Kind::Grad {
            // Differentiated as it is lowered: the gradient of sum(x) is ones of x's type.
            assert_eq!(p.ty(p.outputs[0].id), Some(&p.input("x").unwrap().ty));
            assert_eq!(sexpr(&p, p.outputs[0].id), "(broadcast 1 [4,8])");
            continue;
        }
        assert_eq!(p.node(p.outputs[0].id).opcode(), OpCode::from_name(op.name), "{}", op.name);
    }
}

#[test]
fn dims_are_constants_and_overridable() {
    let text = "dim R = 4\ndim C = 8\ninput x: f32[R, C]\nloss = sum(sum(x, 0), 1) / R\noutput loss\n";
    let p = parse_program("t.eqf", text, &[]).unwrap();
    assert_eq!(sexpr(&p, p.outputs[0].id), "(/ (sum (sum x 0) 1) 4)");
    let p = parse_program("t.eqf", text, &[("R".to_string(), 16), ("C".to_string(), 3)]).unwrap();
    assert_eq!(p.dims, vec![("R".to_string(), 16), ("C".to_string(), 3)]);
    assert_eq!(p.inputs[0].ty.shape, vec![16, 3]);
    assert_eq!(sexpr(&p, p.outputs[0].id), "(/ (sum (sum x 0) 1) 16)");
    assert_eq!(p.source, "t.eqf");
    let e = parse_program("t.eqf", text, &[("Q".to_string(), 2)]).unwrap_err();
    assert!(matches!(&e, Error::Usage(m) if m.contains("declares no dim `Q` (it declares R, C)")), "{e}");
    assert_eq!(parse_dim_override("R=16384"), Ok(("R".to_string(), 16384)));
    assert!(parse_dim_override("R=0").unwrap_err().contains("between 1 and 2^48"));
    assert!(parse_dim_override("R16").unwrap_err().contains("NAME=VALUE"));
}

#[test]
fn deep_but_legal_nesting_is_fine() {
    // Just under the nesting limit, in both directions a tree can grow: recursion in the parser
    // (nested calls, unary minus) and long left-associative chains.
    let n = 60;
    let calls = format!("{}x{}", "exp(".repeat(n), ")".repeat(n));
    let minus = format!("{}x", "-".repeat(n));
    let chain = vec!["x"; 250].join(" + ");
    let both = format!("{}{}{}", "exp(".repeat(n), vec!["x"; 190].join(" + "), ")".repeat(n));
    for src in [calls, minus, chain, both] {
        let text = format!("input x: f32[2]\ny = {src}\noutput y\n");
        parse_program("t.eqf", &text, &[]).unwrap();
    }
}

/// Nesting 100,000 deep is an error at the limit, never a stack overflow, in every direction a
/// tree can grow. (A JSON graph cannot nest: its nodes are a flat list naming earlier nodes by
/// index, and its reader does not recurse.)
#[test]
fn nesting_100000_deep_is_an_error() {
    let n = 100_000;
    let parens = format!("{}x{}", "(".repeat(n), ")".repeat(n));
    let calls = format!("{}x{}", "exp(".repeat(n), ")".repeat(n));
    let minus = format!("{}x", "-".repeat(n));
    let power = vec!["x"; n].join(" ^ ");
    for src in [parens, calls, minus, power] {
        let text = format!("input x: f32[2]\ny = {src}\noutput y\n");
        let err = parse_program("t.eqf", &text, &[]).unwrap_err().to_string();
        assert!(
            err.starts_with("t.eqf:2:") && err.contains("nested more than 64 deep"),
            "{}",
            &err[..200.min(err.len())]
        );
    }
}

#[test]
fn errors_show_the_line_and_a_caret() {
    let e = error_of("input x: f32[4]\ny = x +* 2\noutput y\n");
    assert_eq!(e, "t.eqf:2:8: expected an expression, found `*`\n  |\n2 | y = x +* 2\n  |        ^");
}

fn example_files(dir: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "eqf"))
        .collect();
    files.sort();
    files
}

fn load(path: &Path) -> eqfuse::Result<Program> {
    load_program(path.to_str().unwrap(), &[])
}

#[test]
fn examples_parse() {
    let files = example_files("examples");
    assert!(files.len() >= 11, "{files:?}");
    for f in &files {
        let text = fs::read_to_string(f).unwrap();
        assert!(text.starts_with("# "), "{} opens with a comment", f.display());
        load(f).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn layernorm_example_is_the_design_text() {
    let p = load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/layernorm.eqf")).unwrap();
    assert_eq!(p.dims, vec![("R".to_string(), 4096), ("C".to_string(), 1024)]);
    assert_eq!(p.outputs.len(), 1);
    assert_eq!(
        sexpr(&p, p.outputs[0].id),
        "(+ (* (* (- x (mean x -1)) (rsqrt (+ (mean (* (- x (mean x -1)) (- x (mean x -1))) -1) 1e-5))) gamma) beta)"
    );
    assert_eq!(p.name(p.outputs[0].id), Some("y"));
}

#[test]
fn ok_cases_parse() {
    let files = example_files("tests/cases/ok");
    assert!(files.len() >= 8);
    for f in &files {
        load(f).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn constant_folding_leaves_no_unused_nodes() {
    let mut files = example_files("examples");
    files.extend(example_files("tests/cases/ok"));
    // A loss that only feeds `grad` is not itself computed, so programs with grad are left out.
    let no_grad = |f: &&PathBuf| !fs::read_to_string(f).unwrap().contains("grad(");
    for f in files.iter().filter(no_grad) {
        let p = load(f).unwrap();
        let live = p.live();
        let dead: Vec<String> = (0..p.len()).filter(|&i| !live[i]).map(|i| p.node(Id::from(i)).to_string()).collect();
        assert!(dead.is_empty(), "{}: unused nodes {dead:?}", f.display());
    }
    let p =
        parse_program("t.eqf", "dim N = 4\ninput x: f32[2]\nc = 2\ny = x * (1 / 8 - N) ^ c\noutput y\n", &[]).unwrap();
    assert_eq!(sexpr(&p, p.outputs[0].id), "(* x 15.015625)");
}

#[test]
fn json_round_trip() {
    let mut files = example_files("examples");
    files.extend(example_files("tests/cases/ok"));
    for f in &files {
        let p = load(f).unwrap();
        let text = serde_json::to_string_pretty(&program_to_json(&p)).unwrap();
        let q = program_from_json("g.json", &text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", f.display()));
        assert_eq!(p.expr(), q.expr(), "{}", f.display());
        assert_eq!((&p.inputs, &p.outputs, &p.dims), (&q.inputs, &q.outputs, &q.dims), "{}", f.display());
        for i in 0..p.len() {
            assert_eq!(p.name(Id::from(i)), q.name(Id::from(i)), "{}", f.display());
        }
        assert_eq!(q.source, "g.json");
    }
}

/// JSON has no infinity or NaN: constants that are (a `-inf` mask fill, an `inf` from an ONNX
/// model) are written as strings, and read back as the same values.
#[test]
fn json_non_finite_constants_round_trip() {
    let text = r#"{"schema": "eqfuse.graph/1", "inputs": [{"name": "x", "dtype": "f32", "shape": [4]}],
        "nodes": [{"op": "input", "value": "x"}, {"op": "const", "value": 0}, {"op": ">", "args": [0, 1]},
                  {"op": "const", "value": "-inf"}, {"op": "where", "args": [2, 0, 3]},
                  {"op": "const", "value": "inf"}, {"op": "min", "args": [4, 5]},
                  {"op": "const", "value": "nan"}, {"op": "max", "args": [6, 7]}],
        "outputs": [{"name": "y", "node": 8}]}"#;
    let p = program_from_json("g.json", text).unwrap();
    let exported = program_to_json(&p);
    let consts: Vec<String> = exported["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["op"] == "const")
        .map(|n| n["value"].to_string())
        .collect();
    assert_eq!(consts, ["0", "\"-inf\"", "\"inf\"", "\"nan\""]);
    let q = program_from_json("g.json", &exported.to_string()).unwrap();
    assert_eq!(p.expr(), q.expr());
}

#[test]
fn json_errors() {
    let graph = |nodes: &str, outputs: &str| {
        format!(
            r#"{{"schema": "eqfuse.graph/1", "inputs": [{{"name": "x", "dtype": "f32", "shape": [4, 8]}}],
            "nodes": [{{"op": "input", "value": "x"}}, {nodes}], "outputs": [{outputs}]}}"#
        )
    };
    let err = |text: &str| program_from_json("g.json", text).unwrap_err().to_string();
    let out1 = r#"{"name": "y", "node": 1}"#;
    assert!(err(&graph(r#"{"op": "exq", "args": [0]}"#, out1)).contains("node 1 (`exq`): unknown op `exq`"));
    assert!(err(&graph(r#"{"op": "exp", "args": [1]}"#, out1)).contains("node 1 (`exp`): arg 1 is not an earlier node"));
    assert!(err(&graph(r#"{"op": "exp", "args": [0, 0]}"#, out1)).contains("`exp` takes 1 arguments, got 2"));
    assert!(err(&graph(r#"{"op": "const", "value": "a"}"#, out1)).contains("must be a number, \"inf\""));
    assert!(err(&graph(r#"{"op": "const", "value": 1e39}"#, out1)).contains("value 1e39 is beyond the range of f32"));
    // An output named like an input must be that input (names are files and kernel arguments).
    let exp = r#"{"op": "exp", "args": [0]}"#;
    assert!(err(&graph(exp, r#"{"name": "x", "node": 1}"#)).contains("output `x` has the name of input `x`"));
    assert!(program_from_json("g.json", &graph(exp, r#"{"name": "x", "node": 0}, {"name": "y", "node": 1}"#)).is_ok());
    assert!(err(&graph(r#"{"op": "dims", "value": [0]}"#, out1)).contains("not between 1 and 2^48"));
    assert!(err(&graph(r#"{"op": "exp", "args": [0]}"#, r#"{"name": "y", "node": 9}"#)).contains("no node 9"));
    let grad = r#"{"op": "exp", "args": [0]}, {"op": "grad", "args": [0, 1]}"#;
    assert!(err(&graph(grad, r#"{"name": "g", "node": 2}"#)).contains("grad needs a loss with one element"));
    let grad = r#"{"op": "exp", "args": [0]}, {"op": "const", "value": 0}, {"op": "sum", "args": [1, 2]},
        {"op": "const", "value": 1}, {"op": "sum", "args": [3, 4]}, {"op": "grad", "args": [5, 1]}"#;
    assert!(err(&graph(grad, r#"{"name": "g", "node": 6}"#)).contains("with respect to an input, not `exp`"));
    assert!(err(&graph(r#"{"op": "exp", "args": [0], "extra": 1}"#, out1)).starts_with("g.json:2:"));
    assert!(err(r#"{"schema": "eqfuse.graph/9"}"#).contains("schema `eqfuse.graph/9` is not supported"));
    assert_eq!(err("{\"schema\":\n  [1,}"), "g.json:2:6: expected value\n  |\n2 |   [1,}\n  |      ^");
}

#[test]
fn load_dispatches_on_the_extension() {
    assert!(matches!(load_program("/no/such/model.onnx", &[]), Err(Error::Io { .. })));
    assert!(load_program("tests/onnx/layernorm/model.onnx", &[]).is_ok());
    assert!(matches!(load_program("/no/such/file.eqf", &[]), Err(Error::Io { .. })));
    assert!(load_program("prog.txt", &[]).unwrap_err().to_string().contains("unknown program format"));
    let dir = std::env::temp_dir().join(format!("eqfuse-parse-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("g.json");
    let p = parse_program("t.eqf", "input x: f32[4]\ny = exp(x)\noutput y\n", &[]).unwrap();
    fs::write(&path, program_to_json(&p).to_string()).unwrap();
    let q = load_program(path.to_str().unwrap(), &[]).unwrap();
    assert_eq!(p.expr(), q.expr());
    assert!(load_program(path.to_str().unwrap(), &[("N".to_string(), 2)]).is_err());
    fs::remove_dir_all(&dir).unwrap();
}

/// One error case: where it is expected (`None` for errors with no place) and what it says.
struct Expected {
    place: Option<(usize, usize)>,
    text: String,
    dims: Vec<(String, usize)>,
}

/// Reads `# error: LINE:COL: text` (or `# error: -: text`) and an optional `# dims: N=V ...`.
fn expected(path: &Path, src: &str) -> Expected {
    let mut lines = src.trim_start_matches('\u{feff}').lines();
    let header = lines.next().and_then(|l| l.strip_prefix("# error: "));
    let header = header.unwrap_or_else(|| panic!("{}: first line must be `# error: LINE:COL: text`", path.display()));
    let (place, text) = header.split_once(": ").unwrap_or_else(|| panic!("{}: bad header", path.display()));
    let place = (place != "-").then(|| {
        let (l, c) = place.split_once(':').unwrap_or_else(|| panic!("{}: bad place", path.display()));
        (l.parse().unwrap(), c.parse().unwrap())
    });
    let dims = match lines.next().and_then(|l| l.strip_prefix("# dims: ")) {
        // Split by hand rather than with `parse_dim_override`, so a case can pass a bad value.
        Some(d) => d
            .split_whitespace()
            .map(|o| o.split_once('=').map(|(n, v)| (n.to_string(), v.parse().unwrap())).unwrap())
            .collect(),
        None => vec![],
    };
    Expected { place, text: text.to_string(), dims }
}

#[test]
fn error_cases() {
    let files = example_files("tests/cases/err");
    assert!(files.len() >= 15);
    let mut failures = vec![];
    for f in &files {
        let src = fs::read_to_string(f).unwrap();
        let want = expected(f, &src);
        let name = f.file_name().unwrap().to_str().unwrap();
        let got = match parse_program(name, &src, &want.dims) {
            Ok(_) => {
                failures.push(format!("{name}: parsed, expected an error"));
                continue;
            }
            Err(e) => e,
        };
        let place = match &got {
            Error::Input(d) => Some((d.line, d.col)),
            _ => None,
        };
        let message = got.to_string();
        if place != want.place || !message.contains(&want.text) {
            failures.push(format!("{name}: expected {:?} `{}`, got {place:?}:\n{message}", want.place, want.text));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), files.len(), failures.join("\n"));
}
