//! Programs shared by the code generation, NVRTC and GPU tests: small cases that cover every
//! template, operator, dtype and broadcasting pattern codegen handles.
#![allow(dead_code)]

use eqfuse::{eval_with, random_inputs, DType, Precision, Program, Tensor, TensorType};

pub fn t(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dtype, shape.to_vec())
}

pub fn f32(shape: &[usize]) -> TensorType {
    t(DType::F32, shape)
}

/// Decomposed layernorm of `x` over the last axis.
pub const LAYERNORM: &str =
    "(+ (* (* (- x (mean x -1)) (rsqrt (+ (mean (* (- x (mean x -1)) (- x (mean x -1))) -1) 0.00001))) gamma) beta)";

/// Decomposed softmax of `x` over the last axis.
pub const SOFTMAX: &str = "(/ (exp (- x (amax x -1))) (sum (exp (- x (amax x -1))) -1))";

/// The example programs (`examples/*.eqf` from the working directory, else from the crate's
/// folder), sorted by path.
pub fn example_paths() -> Vec<String> {
    let local = std::path::Path::new("examples");
    let dir = if local.is_dir() {
        local.to_path_buf()
    } else {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
    };
    let mut paths: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "eqf"))
        .filter_map(|p| p.to_str().map(str::to_string))
        .collect();
    paths.sort();
    paths
}

/// `examples/embedding_layernorm.eqf` (in `dtype` instead of f32) with a loss, its outputs
/// against an upstream gradient `dy`, and the gradients of its tables and of layernorm's scale
/// and shift: an embedding backward, whose token table's gradient is a scatter_add of the
/// layernorm's input gradient (the position table's is its sum over the batch between zeros).
pub fn embedding_backward_text(dtype: &str) -> String {
    let local = std::path::Path::new("examples/embedding_layernorm.eqf");
    let path = if local.is_file() {
        local.to_path_buf()
    } else {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/embedding_layernorm.eqf")
    };
    let text = std::fs::read_to_string(path).expect("examples/embedding_layernorm.eqf");
    assert!(text.contains("\nh = gather(") && text.ends_with("output y\n"), "the example changed:\n{text}");
    let text = text.replace("f32[", &format!("{dtype}[")).replace("output y\n", "");
    let text = text.replace("\nh = gather(", &format!("\ninput dy: {dtype}[B, S, E]\nh = gather("));
    text + "loss = sum(sum(sum(y * dy, -1), 1), 0)\ndwte = grad(loss, wte)\ndwpe = grad(loss, wpe)\n\
            dgamma = grad(loss, gamma)\ndbeta = grad(loss, beta)\noutput dwte, dwpe, dgamma, dbeta\n"
}

/// A named case: a program at a size `scale` multiplies (1 for tests).
pub struct Case {
    pub name: &'static str,
    pub program: Program,
}

fn case(name: &'static str, inputs: &[(&str, TensorType)], outputs: &[(&str, &str)]) -> Case {
    let program = Program::from_sexprs(name, inputs, outputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    Case { name, program }
}

/// The small cases (each well under a million elements).
pub fn cases() -> Vec<Case> {
    let (r, c) = (64, 1024);
    let bf = |s: &[usize]| t(DType::Bf16, s);
    let h = |s: &[usize]| t(DType::F16, s);
    vec![
        case("add_mul", &[("x", f32(&[4096])), ("y", f32(&[4096])), ("z", f32(&[4096]))], &[("out", "(* (+ x y) z)")]),
        case("softplus_tail", &[("x", f32(&[1001]))], &[("y", "(log (+ (exp x) 1))")]),
        case("bias_gelu_dropout", &[("x", f32(&[r, c])), ("b", f32(&[c]))], &[("y", "(dropout (gelu (+ x b)) 0.1 7)")]),
        // Dropout with its seed given at run time (an i32 tensor of shape [] or [1]), in an
        // elementwise kernel and in a row kernel's epilogue (the seed an expression).
        case(
            "dropout_seed_tensor",
            &[
                ("x", f32(&[r, c])),
                ("b", f32(&[c])),
                ("g", f32(&[c])),
                ("s", t(DType::I32, &[])),
                ("s1", t(DType::I32, &[1])),
            ],
            &[("y", "(dropout (gelu (+ x b)) 0.1 s)"), ("z", "(dropout (layernorm x g b 0.00001) 0.25 (+ s1 1))")],
        ),
        case("layernorm", &[("x", f32(&[r, c])), ("gamma", f32(&[c])), ("beta", f32(&[c]))], &[("y", LAYERNORM)]),
        case("softmax", &[("x", f32(&[r, c]))], &[("y", SOFTMAX)]),
        case("softmax_odd", &[("x", f32(&[7, 33]))], &[("y", "(softmax x -1)")]),
        case("log_softmax", &[("x", f32(&[32, 4096]))], &[("y", "(log_softmax x -1)")]),
        case("rmsnorm_bf16", &[("x", bf(&[r, c])), ("g", bf(&[c]))], &[("y", "(rmsnorm x g 0.000001)")]),
        case(
            "residual_layernorm",
            &[("x", f32(&[r, 768])), ("res", f32(&[r, 768])), ("g", f32(&[768])), ("b", f32(&[768]))],
            &[("h", "(+ x res)"), ("y", "(layernorm (+ x res) g b 0.00001)")],
        ),
        case("row_sums", &[("x", f32(&[r, 300]))], &[("s", "(sum (* x x) -1)"), ("m", "(amin x -1)")]),
        case(
            "bias_grads",
            &[("g", f32(&[512, 256])), ("xh", f32(&[512, 256]))],
            &[("db", "(sum g 0)"), ("dg", "(sum (* g xh) 0)")],
        ),
        case("col_mean_rank3", &[("x", f32(&[4, 200, 96]))], &[("m", "(mean x 1)"), ("a", "(amax x 1)")]),
        // A layer norm's bf16 weight and bias gradients (summed in f32 over the batch and the
        // sequence, cast back), and a scaled mean: pointwise epilogues of column reductions,
        // computed as the last block stores them.
        case(
            "col_epilogues_bf16",
            &[("g", bf(&[4, 64, 96])), ("xh", f32(&[4, 64, 96]))],
            &[
                ("dw", "(cast (sum (sum (* (cast g f32) xh) 0) 1) bf16)"),
                ("db", "(cast (sum (sum (cast g f32) 0) 1) bf16)"),
                ("m", "(* (exp (mean xh 1)) 0.5)"),
            ],
        ),
        // Column reductions of narrow tiles over a short axis, many of them: several tiles share a
        // block (kernels/colreduce.cu's z slices), the last block's slices partly past the end.
        case("col_narrow_short", &[("x", f32(&[8191, 3, 2]))], &[("s", "(sum x 1)"), ("m", "(amax (* x x) 1)")]),
        case("col_narrow_bf16", &[("x", bf(&[4099, 5, 1]))], &[("s", "(mean x 1)")]),
        case("long_rows", &[("x", f32(&[4, 70000]))], &[("y", SOFTMAX)]),
        case(
            "views",
            &[("a", f32(&[32, 64])), ("bt", f32(&[64, 32])), ("v", f32(&[32, 1]))],
            &[("y", "(+ (* a (transpose bt 0 1)) (broadcast v [32,64]))")],
        ),
        case(
            "pointwise_zoo",
            &[("x", f32(&[8, 128])), ("y", f32(&[8, 128]))],
            &[
                ("u", "(+ (+ (silu x) (sigmoid y)) (+ (tanh x) (gelu_tanh y)))"),
                ("w", "(+ (+ (erf x) (sin y)) (+ (cos x) (abs y)))"),
                ("z", "(+ (+ (sqrt (abs x)) (rsqrt (+ (square y) 1))) (+ (recip (+ (abs x) 1)) (pow (abs y) 1.5)))"),
                ("m", "(where (> x y) (max x y) (min (neg x) y))"),
                ("q", "(relu (- x (* y 2)))"),
            ],
        ),
        case(
            "halves",
            &[("a", bf(&[256, 64])), ("b", h(&[256, 64]))],
            &[("y", "(* a (cast b bf16))"), ("z", "(cast (+ (cast a f32) 1) f16)")],
        ),
        case(
            "ints_and_bools",
            &[("t", t(DType::I32, &[64])), ("k", t(DType::Bool, &[64, 10]))],
            &[("o", "(onehot t 10)"), ("i", "(+ (iota 10) (reshape (/ t 3) [64,1]))"), ("n", "(not k)")],
        ),
        case("scalar", &[("s", f32(&[])), ("x", f32(&[16]))], &[("y", "(* x (exp s))"), ("e", "(exp s)")]),
        // Index maps (issue 20): slices at offsets and strides, concatenation by a select per
        // element, gathers at loaded indices (embedding rows, columns of the last axis).
        case(
            "rope_bf16",
            &[("x", bf(&[4, 64, 128])), ("c", bf(&[64, 128])), ("s", bf(&[64, 128]))],
            &[("y", "(+ (* x c) (* (concat (neg (slice x -1 64 128 1)) (slice x -1 0 64 1) -1) s))")],
        ),
        case(
            "slices_and_concat",
            &[("a", f32(&[64, 96])), ("b", f32(&[64, 32])), ("x", f32(&[64, 1024]))],
            &[
                ("y", "(* (concat a (transpose (slice (transpose a 0 1) 0 10 42 1) 0 1) -1) 2)"),
                ("z", "(+ (slice x -1 1 1024 2) (slice x -1 0 1024 2))"),
                ("w", "(concat (slice a -1 3 35 1) b 0)"),
            ],
        ),
        // A slice's gradient: the upstream gradient between zeros, two nested concats.
        case(
            "slice_grad_pad",
            &[("g", f32(&[64, 128]))],
            &[("y", "(concat (concat (broadcast 0 [64,64]) g -1) (broadcast 0 [64,64]) -1)")],
        ),
        case(
            "gathers",
            &[
                ("tokens", t(DType::I32, &[64])),
                ("wte", f32(&[1000, 256])),
                ("g", f32(&[256])),
                ("b", f32(&[256])),
                ("x", f32(&[64, 300])),
                ("cols", t(DType::I32, &[2, 8])),
            ],
            &[("y", "(layernorm (gather wte tokens 0) g b 0.00001)"), ("e", "(exp (gather x cols -1))")],
        ),
        // scatter_add (the gradient of gather): an embedding table's gradient (indices [B, S],
        // values [B, S, D] into [V, D]), the same in bf16 with the values computed in the kernel
        // (summed in an f32 accumulator), along the last axis (each lane its own index), and of
        // i32 values along a middle axis.
        case(
            "scatter_embedding_grad",
            &[("tokens", t(DType::I32, &[4, 16])), ("dy", f32(&[4, 16, 64]))],
            &[("dwte", "(scatter_add tokens dy 0 100)")],
        ),
        case(
            "scatter_fused_bf16",
            &[("tokens", t(DType::I32, &[4, 16])), ("dy", bf(&[4, 16, 64])), ("m", bf(&[64]))],
            &[("dwte", "(scatter_add tokens (* (gelu dy) m) 0 100)")],
        ),
        case(
            "scatter_last_axis",
            &[("cols", t(DType::I32, &[2, 24])), ("g", f32(&[8, 2, 24]))],
            &[("y", "(scatter_add cols (exp g) -1 20)")],
        ),
        case(
            "scatter_middle_axis_i32",
            &[("t", t(DType::I32, &[3])), ("g", t(DType::I32, &[4, 3, 6]))],
            &[("y", "(scatter_add t g 1 5)")],
        ),
        case(
            "cross_entropy",
            &[("logits", f32(&[64, 1000])), ("t", t(DType::I32, &[64]))],
            &[("loss", "(cross_entropy logits t)")],
        ),
        case("reshaped_row_value", &[("x", f32(&[48, 256]))], &[("s", "(reshape (sum x -1) [48])")]),
        case(
            "attention_causal_bf16",
            &[("q", bf(&[2, 3, 200, 64])), ("k", bf(&[2, 3, 200, 64])), ("v", bf(&[2, 3, 200, 64]))],
            &[("o", "(attention q k v 0.125 1)")],
        ),
        case(
            "attention_f16_d128",
            &[("q", h(&[2, 130, 128])), ("k", h(&[2, 77, 128])), ("v", h(&[2, 77, 128]))],
            &[("o", "(attention q k v 0.088 0)")],
        ),
        case(
            "attention_heads_view",
            &[("q", bf(&[2, 100, 4, 32])), ("k", bf(&[2, 100, 4, 32])), ("v", bf(&[2, 100, 4, 32]))],
            &[("o", "(transpose (attention (transpose q 1 2) (transpose k 1 2) (transpose v 1 2) 0.17 1) 1 2)")],
        ),
        case("attention_self", &[("x", bf(&[1, 4, 96, 16]))], &[("o", "(attention x x x 0.25 0)")]),
        // The f32 (CUDA-core) path: heads over 64 (the query row in shared memory) with ragged
        // query and key lengths; an odd head (scalar loads, padded rows) under a causal mask; a
        // transposed-heads view (16-byte loads at a row stride of 4 heads).
        case(
            "attention_f32_d128",
            &[("q", f32(&[2, 130, 128])), ("k", f32(&[2, 77, 128])), ("v", f32(&[2, 77, 128]))],
            &[("o", "(attention q k v 0.088 0)")],
        ),
        case(
            "attention_f32_odd_head_causal",
            &[("q", f32(&[2, 3, 150, 19])), ("k", f32(&[2, 3, 150, 19])), ("v", f32(&[2, 3, 150, 19]))],
            &[("o", "(attention q k v 0.23 1)")],
        ),
        case(
            "attention_f32_heads_view",
            &[("q", f32(&[2, 100, 4, 32])), ("k", f32(&[2, 100, 4, 32])), ("v", f32(&[2, 100, 4, 32]))],
            &[("o", "(transpose (attention (transpose q 1 2) (transpose k 1 2) (transpose v 1 2) 0.17 1) 1 2)")],
        ),
    ]
}

/// Training programs of attention whose backward runs as the flash kernels reading views and
/// biases (tests/nvrtc.rs compiles them, tests/gpu.rs runs them): `(name, program text)`, the
/// loss `sum(o * dy)` and the gradients of q, k and v. Grouped-query keys and values
/// (`reshape(broadcast(reshape(k)))`) in bf16 and f16, causal and not; heads split from `[B, S,
/// E]` projections (transposed views) with and without grouped keys; `attention_bias` with a
/// padding mask `[B, 1, 1, S]`, a `[B, 1, S, S]` mask, a shared `[S, S]` one, an f32 mask beside
/// bf16 operands, causal and not, and a bool mask lowered as `where(m, 0, -3e38)` (selected in
/// the kernels). Sizes leave ragged tiles (S = 136, 100).
pub fn attention_backward_programs() -> Vec<(String, String)> {
    let grouped =
        |x: &str| format!("reshape(broadcast(reshape({x}, [B, KV, 1, S, D]), [B, KV, G, S, D]), [B, H, S, D])");
    let loss4 = "loss = sum(sum(sum(sum(cast(o, f32) * cast(dy, f32), -1), -2), -3), -4)\n";
    let grads = |a: &str, b: &str, c: &str| {
        format!("d{a} = grad(loss, {a})\nd{b} = grad(loss, {b})\nd{c} = grad(loss, {c})\noutput d{a}, d{b}, d{c}\n")
    };
    let gqa = |t: &str, causal: u8| {
        format!(
            "dim B = 2\ndim H = 8\ndim KV = 2\ndim G = 4\ndim S = 136\ndim D = 64\n\
             input q: {t}[B, H, S, D]\ninput k: {t}[B, KV, S, D]\ninput v: {t}[B, KV, S, D]\ninput dy: {t}[B, H, S, D]\n\
             o = attention(q, {}, {}, 0.125, {causal})\n{loss4}{}",
            grouped("k"),
            grouped("v"),
            grads("q", "k", "v")
        )
    };
    let heads = |t: &str, kv: usize, att: &str, mask: &str| {
        let (k, v) = if kv < 4 { (grouped("kh"), grouped("vh")) } else { ("kh".into(), "vh".into()) };
        format!(
            "dim B = 2\ndim H = 4\ndim KV = {kv}\ndim G = {}\ndim S = 100\ndim D = 64\n\
             input xq: {t}[B, S, 256]\ninput xk: {t}[B, S, {}]\ninput xv: {t}[B, S, {}]\ninput dy: {t}[B, S, 256]\n{mask}\
             qh = transpose(reshape(xq, [B, S, H, D]), 1, 2)\n\
             kh = transpose(reshape(xk, [B, S, KV, D]), 1, 2)\nvh = transpose(reshape(xv, [B, S, KV, D]), 1, 2)\n\
             o = reshape(transpose({}, 1, 2), [B, S, 256])\n\
             loss = sum(sum(sum(cast(o, f32) * cast(dy, f32), -1), -2), -3)\n{}",
            4 / kv,
            kv * 64,
            kv * 64,
            att.replace("{K}", &k).replace("{V}", &v),
            grads("xq", "xk", "xv")
        )
    };
    let biased = |t: &str, mask: &str, causal: u8| {
        format!(
            "dim B = 2\ndim H = 4\ndim S = 136\ndim D = 64\n\
             input q: {t}[B, H, S, D]\ninput k: {t}[B, H, S, D]\ninput v: {t}[B, H, S, D]\ninput dy: {t}[B, H, S, D]\n\
             input mask: {mask}\no = attention_bias(q, k, v, mask, 0.125, {causal})\n{loss4}{}",
            grads("q", "k", "v")
        )
    };
    vec![
        ("gqa_bf16".into(), gqa("bf16", 0)),
        ("gqa_bf16_causal".into(), gqa("bf16", 1)),
        ("gqa_f16_causal".into(), gqa("f16", 1)),
        ("heads_bf16_causal".into(), heads("bf16", 4, "attention(qh, {K}, {V}, 0.125, 1)", "")),
        ("heads_gqa_f16".into(), heads("f16", 2, "attention(qh, {K}, {V}, 0.125, 0)", "")),
        (
            "heads_bool_mask_bf16_causal".into(),
            heads(
                "bf16",
                4,
                "attention_bias(qh, {K}, {V}, where(m, 0, -3e38), 0.125, 1)",
                "input m: bool[B, 1, 1, S]\n",
            ),
        ),
        (
            "heads_gqa_padding_f16".into(),
            heads("f16", 2, "attention_bias(qh, {K}, {V}, m, 0.125, 0)", "input m: f16[B, 1, 1, S]\n"),
        ),
        ("bias_padding_bf16".into(), biased("bf16", "bf16[B, 1, 1, S]", 0)),
        ("bias_padding_bf16_causal".into(), biased("bf16", "bf16[B, 1, 1, S]", 1)),
        ("bias_full_f16".into(), biased("f16", "f16[B, 1, S, S]", 0)),
        ("bias_full_bf16_causal".into(), biased("bf16", "bf16[B, 1, S, S]", 1)),
        ("bias_square_f32_mask_bf16".into(), biased("bf16", "f32[S, S]", 1)),
        // f32: the CUDA-core kernels.
        ("gqa_f32_causal".into(), gqa("f32", 1)),
        (
            "heads_bool_mask_f32_causal".into(),
            heads(
                "f32",
                4,
                "attention_bias(qh, {K}, {V}, where(m, 0, -3e38), 0.125, 1)",
                "input m: bool[B, 1, 1, S]\n",
            ),
        ),
        ("bias_padding_f32_causal".into(), biased("f32", "f32[B, 1, 1, S]", 1)),
        ("bias_full_f32".into(), biased("f32", "f32[B, 1, S, S]", 0)),
    ]
}

/// Programs of attention with dropout of its probabilities (`attention_dropout`,
/// `attention_bias_dropout`) and their gradients: grouped-query keys and values, heads split
/// from projections, padding and full biases, a bool mask's select, causal or not, p 0.1 and
/// 0.5, bf16 and f16 (the flash backward) and f32 (the forward kernel's f32 path; the backward
/// decomposed), the seed a literal or an i32 input (`s: i32[]`, or element 1 of `seeds:
/// i32[3]` as the PyTorch backend passes it), heads of 64 and 128, and written out (`written_*`:
/// causal attention and attention with a padding bias, `dropout(softmax(..)) @ v`, forward only).
/// Each name says what it holds. On a 9.0 device the 16-bit forward kernels take the Hopper path.
pub fn attention_dropout_programs() -> Vec<(String, String)> {
    let grouped =
        |x: &str| format!("reshape(broadcast(reshape({x}, [B, KV, 1, S, D]), [B, KV, G, S, D]), [B, H, S, D])");
    let loss4 = "loss = sum(sum(sum(sum(cast(o, f32) * cast(dy, f32), -1), -2), -3), -4)\n";
    let grads = |a: &str, b: &str, c: &str| {
        format!("d{a} = grad(loss, {a})\nd{b} = grad(loss, {b})\nd{c} = grad(loss, {c})\noutput o, d{a}, d{b}, d{c}\n")
    };
    let seeds = "input s: i32[]\ninput seeds: i32[3]\n";
    let gqa = |t: &str, causal: u8, p: f64, seed: &str| {
        format!(
            "dim B = 2\ndim H = 8\ndim KV = 2\ndim G = 4\ndim S = 136\ndim D = 64\n{seeds}\
             input q: {t}[B, H, S, D]\ninput k: {t}[B, KV, S, D]\ninput v: {t}[B, KV, S, D]\ninput dy: {t}[B, H, S, D]\n\
             o = attention_dropout(q, {}, {}, 0.125, {causal}, {p}, {seed})\n{loss4}{}",
            grouped("k"),
            grouped("v"),
            grads("q", "k", "v")
        )
    };
    let heads = |t: &str, att: &str, mask: &str| {
        format!(
            "dim B = 2\ndim H = 4\ndim S = 100\ndim D = 64\n{seeds}\
             input xq: {t}[B, S, 256]\ninput xk: {t}[B, S, 256]\ninput xv: {t}[B, S, 256]\ninput dy: {t}[B, S, 256]\n{mask}\
             qh = transpose(reshape(xq, [B, S, H, D]), 1, 2)\n\
             kh = transpose(reshape(xk, [B, S, H, D]), 1, 2)\nvh = transpose(reshape(xv, [B, S, H, D]), 1, 2)\n\
             o = reshape(transpose({att}, 1, 2), [B, S, 256])\n\
             loss = sum(sum(sum(cast(o, f32) * cast(dy, f32), -1), -2), -3)\n{}",
            grads("xq", "xk", "xv")
        )
    };
    let biased = |t: &str, mask: &str, causal: u8, p: f64| {
        format!(
            "dim B = 2\ndim H = 4\ndim S = 136\ndim D = 64\n{seeds}\
             input q: {t}[B, H, S, D]\ninput k: {t}[B, H, S, D]\ninput v: {t}[B, H, S, D]\ninput dy: {t}[B, H, S, D]\n\
             input mask: {mask}\no = attention_bias_dropout(q, k, v, mask, 0.125, {causal}, {p}, s)\n{loss4}{}",
            grads("q", "k", "v")
        )
    };
    let f32_fwd = |causal: u8, bias: bool, p: f64| {
        let (mask, att) = if bias {
            ("input mask: f32[B, 1, 1, S]\n", format!("attention_bias_dropout(q, k, v, mask, 0.125, {causal}, {p}, s)"))
        } else {
            ("", format!("attention_dropout(q, k, v, 0.125, {causal}, {p}, 12345)"))
        };
        format!(
            "dim B = 2\ndim H = 4\ndim S = 100\ndim D = 40\n{seeds}{mask}\
             input q: f32[B, H, S, D]\ninput k: f32[B, H, S, D]\ninput v: f32[B, H, S, D]\no = {att}\noutput o\n"
        )
    };
    // Written out (forward only: the pattern rules make the kernel; a gradient of the written
    // form is differentiated through its parts).
    let written = |t: &str, p: f64| {
        format!(
            "dim B = 2\ndim H = 4\ndim S = 136\ndim D = 64\n{seeds}\
             input q: {t}[B, H, S, D]\ninput k: {t}[B, H, S, D]\ninput v: {t}[B, H, S, D]\ninput mask: {t}[B, 1, 1, S]\n\
             row = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             o = dropout(softmax(where(col <= row, q @ transpose(k, -1, -2) / 8, -1e30), -1), {p}, s) @ v\n\
             o2 = dropout(softmax(q @ transpose(k, -1, -2) * 0.125 + mask, -1), {p}, slice(seeds, 0, 0, 1, 1)) @ v\noutput o, o2\n"
        )
    };
    // Heads of 128 (the Hopper path's one block an SM, two 64-column blocks of a row), 200
    // queries and keys (four key tiles, the last partial).
    let wide = |t: &str, causal: u8| {
        format!(
            "dim B = 2\ndim H = 2\ndim S = 200\ndim D = 128\n{seeds}\
             input q: {t}[B, H, S, D]\ninput k: {t}[B, H, S, D]\ninput v: {t}[B, H, S, D]\ninput dy: {t}[B, H, S, D]\n\
             input mask: {t}[B, 1, 1, S]\no = attention_bias_dropout(q, k, v, mask, 0.125, {causal}, 0.1, s)\n{loss4}{}",
            grads("q", "k", "v")
        )
    };
    let seed1 = "slice(seeds, 0, 1, 2, 1)";
    vec![
        ("gqa_bf16_p0.1_literal".into(), gqa("bf16", 0, 0.1, "7")),
        ("gqa_bf16_causal_p0.5".into(), gqa("bf16", 1, 0.5, "s")),
        ("gqa_f16_causal_p0.1_seeds".into(), gqa("f16", 1, 0.1, seed1)),
        (
            "heads_bf16_causal_p0.1".into(),
            heads("bf16", &format!("attention_dropout(qh, kh, vh, 0.125, 1, 0.1, {seed1})"), ""),
        ),
        ("heads_f16_p0.5".into(), heads("f16", "attention_dropout(qh, kh, vh, 0.125, 0, 0.5, s)", "")),
        (
            "heads_bool_mask_bf16_causal_p0.1".into(),
            heads(
                "bf16",
                "attention_bias_dropout(qh, kh, vh, where(m, 0, -3e38), 0.125, 1, 0.1, s)",
                "input m: bool[B, 1, 1, S]\n",
            ),
        ),
        ("bias_padding_bf16_p0.1".into(), biased("bf16", "bf16[B, 1, 1, S]", 0, 0.1)),
        ("bias_padding_bf16_causal_p0.5".into(), biased("bf16", "bf16[B, 1, 1, S]", 1, 0.5)),
        ("bias_full_f16_p0.5".into(), biased("f16", "f16[B, 1, S, S]", 0, 0.5)),
        ("bias_square_f32_mask_bf16_causal_p0.1".into(), biased("bf16", "f32[S, S]", 1, 0.1)),
        ("head128_padding_bf16_causal_p0.1".into(), wide("bf16", 1)),
        ("head128_padding_f16_p0.1".into(), wide("f16", 0)),
        ("f32_p0.1".into(), f32_fwd(0, false, 0.1)),
        ("f32_causal_p0.5".into(), f32_fwd(1, false, 0.5)),
        ("f32_bias_causal_p0.1".into(), f32_fwd(1, true, 0.1)),
        ("written_bf16_p0.1".into(), written("bf16", 0.1)),
        ("written_f16_p0.5".into(), written("f16", 0.5)),
    ]
}

/// Row kernels over rows too long for one block's registers, which a 9.0 device spreads over
/// clusters of blocks (`caps::row_cluster`), and one that fits (bf16 rows of 32000): softmax,
/// log-softmax, cross-entropy (a mean over rows) and its gradient, layernorm (its scale and
/// shift gathered) and rmsnorm, bf16 and f32, over vocabularies of 50257 (shifted rows) and
/// 128256, 32001 and odd widths, over 37 rows (a count nothing divides) and one row.
/// tests/nvrtc.rs compiles them, tests/gpu.rs runs them.
pub fn cluster_row_programs() -> Vec<(String, String)> {
    let rows = |r: usize, v: usize, dtype: &str, body: &str| {
        format!("dim R = {r}\ndim V = {v}\ninput x: {dtype}[R, V]\n{body}")
    };
    let ce = |r: usize, v: usize, dtype: &str, grad: bool| {
        let g = if grad { "dx = grad(loss, x)\noutput loss, dx\n" } else { "output loss\n" };
        rows(r, v, dtype, &format!("input t: i32[R]\nloss = cross_entropy(x, t)\n{g}"))
    };
    let softmax = "y = softmax(x, -1)\noutput y\n";
    let log_softmax = "y = log_softmax(x, -1)\noutput y\n";
    let norm =
        |dtype: &str| format!("input g: {dtype}[V]\ninput b: {dtype}[V]\ny = layernorm(x, g, b, 0.00001)\noutput y\n");
    vec![
        ("softmax bf16 37x50257".into(), rows(37, 50257, "bf16", softmax)),
        ("softmax bf16 1x50257".into(), rows(1, 50257, "bf16", softmax)),
        ("softmax f32 37x50257".into(), rows(37, 50257, "f32", softmax)),
        ("softmax bf16 37x128256".into(), rows(37, 128256, "bf16", softmax)),
        ("log_softmax f32 37x128256".into(), rows(37, 128256, "f32", log_softmax)),
        ("log_softmax bf16 37x50257".into(), rows(37, 50257, "bf16", log_softmax)),
        ("cross_entropy bf16 37x50257".into(), ce(37, 50257, "bf16", false)),
        ("cross_entropy and its gradient bf16 37x50257".into(), ce(37, 50257, "bf16", true)),
        ("cross_entropy and its gradient f32 37x128256".into(), ce(37, 128256, "f32", true)),
        ("cross_entropy and its gradient f32 37x32001".into(), ce(37, 32001, "f32", true)),
        ("layernorm f32 37x50257".into(), rows(37, 50257, "f32", &norm("f32"))),
        ("layernorm bf16 37x77777".into(), rows(37, 77777, "bf16", &norm("bf16"))),
        (
            "rmsnorm bf16 37x128256".into(),
            rows(37, 128256, "bf16", "input g: bf16[V]\ny = rmsnorm(x, g, 0.00001)\noutput y\n"),
        ),
        ("softmax f32 37x40001".into(), rows(37, 40001, "f32", softmax)),
        ("softmax bf16 37x32000".into(), rows(37, 32000, "bf16", softmax)),
    ]
}

/// Reductions over few long rows, which the row template cuts into segments (one block each,
/// the last block of a row combining the partials): `(name, program text, segments)`, where
/// `segments` is the `EQ_SEGS` some fused row kernel of the program must have. One row (a
/// tensor summed to one value, a loss reduced to a scalar, an online
/// max and sum of exponentials with its max as an output too), 3 shifted bf16 rows of 3.3
/// million (three statistics in one kernel: an RMS norm's reciprocal, max, min), 100 rows of
/// 100,000 (mean, with a per-row epilogue), the fidelity run's g53 (a gelu-weighted sum to one
/// value and its gradients, beside the `x0 - 0.5` of an i32 tensor its GPU run missed), and a softmax of one huge row (planned as a segmented kernel of
/// its max and sum of exponentials, then an elementwise kernel that normalises).
/// tests/long_rows.rs plans and checks them on the CPU, tests/nvrtc.rs compiles them,
/// tests/gpu.rs runs them.
pub fn long_row_programs() -> Vec<(&'static str, String, usize)> {
    vec![
        (
            "sum of 8388608 f32 to one value",
            "input x: f32[2048, 4096]\ny = sum(reshape(x, [8388608]), 0)\noutput y\n".into(),
            256,
        ),
        (
            "mse and a weighted sum of 4194304 f32 to scalars",
            "input a: f32[4194304]\ninput b: f32[4194304]\nd = a - b\nmse = mean(d * d, 0)\n\
             w = sum(gelu_tanh(a) * b, 0)\noutput mse, w\n"
                .into(),
            256,
        ),
        (
            "online max and sum of exponentials of one f32 row of 1000000",
            "input x: f32[1000000]\nm = amax(x, 0)\ns = sum(exp(x - m), 0)\nlse = log(s) + m\noutput m, lse\n".into(),
            123,
        ),
        (
            "rms, max and min of 3 bf16 rows of 3333333",
            "input x: bf16[3, 3333333]\nr = rsqrt(mean(cast(x, f32) * cast(x, f32), -1) + 0.00001)\n\
             hi = amax(x, -1)\nlo = amin(x, -1)\noutput r, hi, lo\n"
                .into(),
            82,
        ),
        (
            "mean and sum of 100 f32 rows of 100000, scaled",
            "input z: f32[100, 100000]\nzm = mean(z, -1)\nzs = sqrt(sum(z * z, -1)) * 0.5\noutput zm, zs\n".into(),
            3,
        ),
        (
            "sum of 5 bf16 rows of 200000 in f32",
            "input x: bf16[5, 200000]\ny = sum(cast(x, f32), -1)\noutput y\n".into(),
            13,
        ),
        (
            "fidelity g53: a gelu-weighted sum of 8388608 and its gradients",
            "input x0: i32[2048, 4096, 1]\ninput x1: f32[2048, 4096, 1]\ninput x2: f32[2048, 4096, 1]\n\
             t0 = x0 - 0.5\nt1 = gelu_tanh(x1)\nt2 = sum(reshape(t1 * x2, [8388608]), 0)\n\
             t3 = grad(t2, x1)\nt4 = grad(t2, x2)\noutput t0, t2, t3, t4\n"
                .into(),
            256,
        ),
        ("softmax of one f32 row of 1000000", "input x: f32[1, 1000000]\ny = softmax(x, -1)\noutput y\n".into(), 123),
    ]
}

/// Programs whose matrix products and attention read slices of tensors in memory in place
/// (tests/attention.rs plans, checks and compiles them; tests/gpu.rs runs them): `(name, program
/// text)`. GPT-2's attention, q, k and v split from one `[B, S, 3E]` projection (bf16 causal
/// forward with the output projection; its training step, whose backward kernels read the
/// slices too; f32; f32 whose slices start at an odd element, read by scalar loads); the three
/// projections of one activation written apart, which `matmul-shared-lhs` fuses into slices of
/// one product; a product whose A operand is a slice (`slice(h, -1, 0, 256) @ w`, f32 with its
/// gradients, bf16 from element 4, which the tensor cores' 16-byte staging cannot load); a bf16
/// attention whose slices start at element 4, which its kernels cannot read in place (copied
/// first). Sizes leave ragged tiles (S = 100).
pub fn sliced_operand_programs() -> Vec<(String, String)> {
    // q, k, v split from `qkv` ([B, S, 3E + pad], the first `pad` columns unused), heads
    // `[B, H, S, D]`, attention merged back to `[B, S, E]`.
    let split = |t: &str, pad: usize, causal: u8| {
        let (e, d) = (if t == "f32" { 96 } else { 256 }, if t == "f32" { 24 } else { 64 });
        // (The bounds in terms of E: the test of GPT-2 small's sizes overrides the dims.)
        let head = |i: usize| {
            format!("transpose(reshape(slice(qkv, 2, {pad} + {i} * E, {pad} + {} * E), [B, S, H, D]), 1, 2)", i + 1)
        };
        format!(
            "dim B = 2\ndim S = 100\ndim E = {e}\ndim H = 4\ndim D = {d}\ndim W = {}\n\
             input x: {t}[B, S, E]\ninput w: {t}[E, W]\ninput b: {t}[W]\n\
             qkv = x @ w + b\nq = {}\nk = {}\nv = {}\n\
             o = reshape(transpose(attention(q, k, v, 0.125, {causal}), 1, 2), [B, S, E])\n",
            3 * e + pad,
            head(0),
            head(1),
            head(2)
        )
    };
    let projected = format!("{}input wo: bf16[E, E]\ny = o @ wo\noutput y\n", split("bf16", 0, 1));
    let train = format!(
        "{}input dy: bf16[B, S, E]\nloss = sum(sum(sum(cast(o, f32) * cast(dy, f32), -1), -2), -3)\n\
         dx = grad(loss, x)\ndw = grad(loss, w)\ndb = grad(loss, b)\noutput o, dx, dw, db\n",
        split("bf16", 0, 1)
    );
    let shared = "dim B = 2\ndim S = 100\ndim E = 256\ndim H = 4\ndim D = 64\n\
                  input x: bf16[B, S, E]\ninput wq: bf16[E, E]\ninput wk: bf16[E, E]\ninput wv: bf16[E, E]\n\
                  q = transpose(reshape(x @ wq, [B, S, H, D]), 1, 2)\nk = transpose(reshape(x @ wk, [B, S, H, D]), 1, 2)\n\
                  v = transpose(reshape(x @ wv, [B, S, H, D]), 1, 2)\n\
                  o = reshape(transpose(attention(q, k, v, 0.125, 1), 1, 2), [B, S, E])\noutput o\n";
    let sliced_a = |t: &str, start: usize| {
        format!(
            "input h: {t}[64, 520]\ninput w: {t}[256, 256]\ninput dy: {t}[64, 256]\n\
             y = slice(h, -1, {start}, {}) @ w\nloss = sum(sum(cast(y, f32) * cast(dy, f32), -1), -2)\n\
             dh = grad(loss, h)\ndw = grad(loss, w)\noutput y, dh, dw\n",
            start + 256
        )
    };
    vec![
        ("gpt2_qkv_bf16_causal".into(), projected),
        ("gpt2_qkv_train_bf16".into(), train),
        ("gpt2_qkv_f32".into(), format!("{}output o\n", split("f32", 0, 0))),
        ("gpt2_qkv_f32_odd_offset".into(), format!("{}output o\n", split("f32", 1, 1))),
        ("shared_lhs_bf16".into(), shared.into()),
        ("sliced_a_f32".into(), sliced_a("f32", 0)),
        ("sliced_a_bf16_offset_4".into(), sliced_a("bf16", 4)),
        ("gpt2_qkv_bf16_offset_4".into(), format!("{}output o\n", split("bf16", 4, 0))),
    ]
}

/// Asserts that output `i + 1` of `p` is the gradient of its scalar output 0 with respect to
/// input `wrt[i]`: central finite differences of the unrounded reference at inputs of `seed`
/// agree to 1e-6 + 1e-5 of the gradient's largest element. `what` names the case in messages.
pub fn assert_gradients_match_finite_differences(p: &Program, wrt: &[&str], seed: u64, what: &str) {
    let base = random_inputs(p, seed);
    let out = eval_with(p, &base, Precision::F64).unwrap();
    let h = 1e-5;
    for (wi, w) in wrt.iter().enumerate() {
        let g = &out[wi + 1];
        let scale = g.data.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        for j in 0..g.numel() {
            let at = |delta: f64| {
                let mut x: std::collections::HashMap<String, Tensor> = base.clone();
                x.get_mut(*w).unwrap().data[j] += delta;
                eval_with(p, &x, Precision::F64).unwrap()[0].data[0]
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            assert!(
                (fd - g.data[j]).abs() <= 1e-6 + 1e-5 * scale,
                "{what}: d loss / d {w}[{j}] is {} but finite differences give {fd}",
                g.data[j]
            );
        }
    }
}

/// Programs reading inputs transposed (the elementwise template's tiled path, and the plain
/// path where a tile would touch more sectors), as `(name, source)`: 2-D and 4-D permutes in
/// bf16 and f32 at sizes no tile divides, a transposed input beside a contiguous one and a
/// broadcast row, a transposed i32 input, and a [N, 2] input read as [2, N].
pub fn transposed_programs() -> Vec<(String, String)> {
    let p = |name: &str, text: &str| (name.to_string(), text.to_string());
    vec![
        p("transpose_2d_bf16", "input x: bf16[67, 45]\ny = transpose(x, 0, 1)\noutput y\n"),
        p("transpose_2d_f32", "input x: f32[130, 97]\ny = transpose(x, 0, 1)\noutput y\n"),
        p(
            "transpose_add_bias_f32",
            "input x: f32[33, 70]\ninput z: f32[70, 33]\ninput b: f32[33]\n\
             y = exp(transpose(x, 0, 1)) * z + b\noutput y\n",
        ),
        p("permute_4d_bf16", "input x: bf16[3, 37, 5, 41]\ny = transpose(x, 1, 3)\noutput y\n"),
        p(
            "permute_4d_f32_two_outputs",
            "input x: f32[2, 33, 3, 40]\ninput z: f32[2, 40, 3, 33]\n\
             y = transpose(x, 1, 3) - z\nw = y * 2.0\noutput y, w\n",
        ),
        p("heads_to_last_bf16", "input x: bf16[2, 50, 3, 36]\ny = transpose(transpose(x, 1, 2), 2, 3)\noutput y\n"),
        p("transpose_i32", "input x: i32[40, 70]\ny = transpose(x, 0, 1) * 3\noutput y\n"),
        p("pairs_f32", "input x: f32[4099, 2]\ny = transpose(x, 0, 1) + 1.0\noutput y\n"),
    ]
}

/// The attention half of a GPT-2 training step as the PyTorch backend's graphs have it
/// (`benches/programs/gpt2_attention_grad_bf16.eqf`, whose attention kernels write through
/// views: the forward its output heads-merged, the backward dq, dk and dv as the column blocks
/// of d(qkv)), at small sizes: bf16 with 80 queries (a partial row tile) and heads of 32, f16
/// with heads of 64; and the gradients heads-merged as outputs too (each written once: the
/// backward kernel stores them or d(qkv), not both).
pub fn attention_write_programs() -> Vec<(String, Program)> {
    let path = "benches/programs/gpt2_attention_grad_bf16.eqf";
    let dims = |b: usize, s: usize, h: usize, d: usize| -> Vec<(String, usize)> {
        let e = h * d;
        [("B", b), ("S", s), ("H", h), ("D", d), ("E", e), ("E3", 3 * e), ("N", b * s)]
            .iter()
            .map(|&(n, v)| (n.to_string(), v))
            .collect()
    };
    let text = std::fs::read_to_string(path).unwrap();
    let parse = |name: &str, text: &str, dims: &[(String, usize)]| -> (String, Program) {
        (name.to_string(), eqfuse::parse_program(path, text, dims).unwrap_or_else(|e| panic!("{name}: {e}")))
    };
    let merged =
        text.replace("output y, dx, dw_attn, dw_proj", "output y, dx, dw_attn, dw_proj, merge_q, merge_k, merge_v");
    vec![
        parse("gpt2_attention_grad_bf16_s80_d32", &text, &dims(2, 80, 2, 32)),
        parse("gpt2_attention_grad_f16_d64", &text.replace("bf16", "f16"), &dims(2, 128, 2, 64)),
        parse("gpt2_attention_grad_bf16_merged_outputs", &merged, &dims(2, 64, 2, 64)),
    ]
}
