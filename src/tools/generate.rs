//! Generated programs for benches and scaling tests.
//!
//! Invariant: generation is deterministic; the same arguments give the same text.

use std::fmt::Write as _;

/// A stack of `blocks` residual blocks over `x: f32[R, C]`, each a decomposed layernorm
/// followed by an elementwise MLP tail (per-channel weights, gelu, silu, a sigmoid gate, tanh)
/// and a residual add: about 40 operators a block.
pub fn residual_stack_eqf(blocks: usize, rows: usize, cols: usize) -> String {
    let mut s = format!("# {blocks} residual blocks: layernorm + elementwise MLP tail + residual\n");
    let _ = writeln!(s, "dim R = {rows}\ndim C = {cols}\ninput x0: f32[R, C]");
    for b in 0..blocks {
        for w in ["g", "be", "w1", "b1", "w2", "b2", "w3", "w4", "b4"] {
            let _ = writeln!(s, "input {w}_{b}: f32[C]");
        }
    }
    for b in 0..blocks {
        let x = format!("x{b}");
        let _ = writeln!(s, "mu_{b} = mean({x}, -1)");
        let _ = writeln!(s, "xc_{b} = {x} - mu_{b}");
        let _ = writeln!(s, "var_{b} = mean(xc_{b} * xc_{b}, -1)");
        let _ = writeln!(s, "h_{b} = xc_{b} * rsqrt(var_{b} + 1e-5) * g_{b} + be_{b}");
        let _ = writeln!(s, "a1_{b} = gelu(h_{b} * w1_{b} + b1_{b})");
        let _ = writeln!(s, "a2_{b} = silu(a1_{b} * w2_{b} + b2_{b}) * sigmoid(h_{b} * w3_{b})");
        let _ = writeln!(s, "a3_{b} = tanh(a2_{b} * w4_{b} + b4_{b}) * 0.5 + a1_{b} * 0.25");
        let _ = writeln!(s, "a4_{b} = a3_{b} * a3_{b} - exp(-a2_{b} * a2_{b}) / (1 + abs(a1_{b}))");
        let _ = writeln!(s, "x{} = {x} + a4_{b} * 0.1 + a3_{b} * 0.05", b + 1);
    }
    let _ = writeln!(s, "output x{blocks}");
    s
}

/// A stack of `blocks` pre-norm transformer blocks (GPT-2 small shape: width 768, 12 heads of
/// 64, MLP width 3072) over `x0: f32[B, S, 768]`: layernorm, attention written out across heads
/// (two products around a max-shifted softmax), residual, layernorm, MLP with gelu, residual —
/// the block of `examples/transformer_block.eqf`, repeated with weights of its own. With
/// `backward`, an upstream gradient `dy` is given and the program also outputs the gradient of
/// `sum(y * dy)` with respect to the input and every weight (the joint forward and backward graph).
pub fn transformer_stack_eqf(blocks: usize, batch: usize, seq: usize, backward: bool) -> String {
    let mut s = format!(
        "# {blocks} pre-norm transformer blocks{}\n",
        if backward { ", forward and backward" } else { ", forward" }
    );
    let _ = writeln!(s, "dim B = {batch}\ndim S = {seq}\ndim E = 768\ndim H = 12\ndim Dh = 64\ndim F = 3072");
    let _ = writeln!(s, "input x0: f32[B, S, E]");
    let weights = |b: usize| {
        [
            ("ln1_g", "E"),
            ("ln1_b", "E"),
            ("wq", "E, E"),
            ("wk", "E, E"),
            ("wv", "E, E"),
            ("wo", "E, E"),
            ("ln2_g", "E"),
            ("ln2_b", "E"),
            ("w1", "E, F"),
            ("b1", "F"),
            ("w2", "F, E"),
            ("b2", "E"),
        ]
        .map(|(w, shape)| (format!("{w}_{b}"), shape))
    };
    for b in 0..blocks {
        for (w, shape) in weights(b) {
            let _ = writeln!(s, "input {w}: f32[{shape}]");
        }
    }
    if backward {
        let _ = writeln!(s, "input dy: f32[B, S, E]");
    }
    for b in 0..blocks {
        let (x, y) = (format!("x{b}"), format!("x{}", b + 1));
        let _ = writeln!(s, "h_{b} = layernorm({x}, ln1_g_{b}, ln1_b_{b}, 1e-5)");
        for p in ["q", "k", "v"] {
            let _ = writeln!(s, "{p}_{b} = transpose(reshape(h_{b} @ w{p}_{b}, [B, S, H, Dh]), 1, 2)");
        }
        let _ = writeln!(s, "s_{b} = q_{b} @ transpose(k_{b}, -1, -2) * 0.125");
        let _ = writeln!(s, "e_{b} = exp(s_{b} - amax(s_{b}, -1))");
        let _ = writeln!(s, "p_{b} = e_{b} / sum(e_{b}, -1)");
        let _ = writeln!(s, "a_{b} = reshape(transpose(p_{b} @ v_{b}, 1, 2), [B, S, E])");
        let _ = writeln!(s, "r_{b} = {x} + a_{b} @ wo_{b}");
        let _ = writeln!(s, "h2_{b} = layernorm(r_{b}, ln2_g_{b}, ln2_b_{b}, 1e-5)");
        let _ = writeln!(s, "{y} = r_{b} + gelu(h2_{b} @ w1_{b} + b1_{b}) @ w2_{b} + b2_{b}");
    }
    let mut outputs = vec![format!("x{blocks}")];
    if backward {
        let _ = writeln!(s, "loss = sum(sum(sum(x{blocks} * dy, -1), 1), 0)");
        let _ = writeln!(s, "dx0 = grad(loss, x0)");
        outputs.push("dx0".into());
        for b in 0..blocks {
            for (w, _) in weights(b) {
                let _ = writeln!(s, "d{w} = grad(loss, {w})");
                outputs.push(format!("d{w}"));
            }
        }
    }
    let _ = writeln!(s, "output {}", outputs.join(", "));
    s
}

/// The elementwise functions [`skip_chain_eqf`] cycles through by default: bounded ones, so
/// that the values of a long chain stay finite on random inputs (the reference can check it).
pub const SKIP_CHAIN_FUNCTIONS: [&str; 5] = ["tanh", "sigmoid", "sin", "cos", "erf"];

/// A chain of `bindings` bindings with skip connections over `x, y: f32[R, C]`:
/// `t_i = f_i(t_{i-1}) * y + t_{i-7}` (`t_j` is `x` for `j < 1`), `f_i` cycling through
/// `functions` (the issue-18 scaling program, e.g. `["exp"]`); the output is the last binding.
/// Every binding is read by the next one and by the seventh after it, so a fusion planner sees
/// a long DAG whose values all have two consumers.
pub fn skip_chain_eqf(bindings: usize, rows: usize, cols: usize, functions: &[&str]) -> String {
    let functions = if functions.is_empty() { &SKIP_CHAIN_FUNCTIONS[..] } else { functions };
    let mut s = format!("# {bindings} chained bindings with skip connections: t_i = f(t_(i-1)) * y + t_(i-7)\n");
    let _ = writeln!(s, "dim R = {rows}\ndim C = {cols}\ninput x: f32[R, C]\ninput y: f32[R, C]");
    let name = |j: isize| if j < 1 { "x".to_string() } else { format!("t{j}") };
    for i in 1..=bindings as isize {
        let f = functions[(i as usize - 1) % functions.len()];
        let _ = writeln!(s, "t{i} = {f}({}) * y + {}", name(i - 1), name(i - 7));
    }
    let _ = writeln!(s, "output {}", name(bindings as isize));
    s
}

/// A GPT-2-like training step of `layers` blocks (GPT-2 small's widths: vocabulary 50304,
/// 1024 positions, width 768, 12 heads of 64, MLP width 3072) over `tokens: i32[B, S]`: token
/// and position embeddings (gather, slice), pre-norm blocks with biases and causal attention
/// written out (a mask built from `iota`, a max-shifted softmax), a final layernorm, logits by
/// the tied token embedding, mean cross-entropy against `targets` written out, and the gradient
/// of the loss with respect to every weight (the joint forward and backward graph). Outputs the
/// loss and the gradients.
pub fn gpt2_train_eqf(layers: usize, batch: usize, seq: usize) -> String {
    let n = batch * seq;
    let mut s = format!("# a GPT-2-like training step: {layers} blocks, forward and backward\n");
    let _ = writeln!(
        s,
        "dim B = {batch}\ndim S = {seq}\ndim N = {n}\ndim V = 50304\ndim P = 1024\ndim E = 768\ndim H = 12\ndim Dh = 64\ndim F = 3072"
    );
    let _ = writeln!(s, "input tokens: i32[B, S]\ninput targets: i32[N]\ninput wte: f32[V, E]\ninput wpe: f32[P, E]");
    let weights = |b: usize| {
        [
            ("ln1_g", "E"),
            ("ln1_b", "E"),
            ("wq", "E, E"),
            ("bq", "E"),
            ("wk", "E, E"),
            ("bk", "E"),
            ("wv", "E, E"),
            ("bv", "E"),
            ("wo", "E, E"),
            ("bo", "E"),
            ("ln2_g", "E"),
            ("ln2_b", "E"),
            ("w1", "E, F"),
            ("b1", "F"),
            ("w2", "F, E"),
            ("b2", "E"),
        ]
        .map(|(w, shape)| (format!("{w}_{b}"), shape))
    };
    for b in 0..layers {
        for (w, shape) in weights(b) {
            let _ = writeln!(s, "input {w}: f32[{shape}]");
        }
    }
    let _ = writeln!(s, "input lnf_g: f32[E]\ninput lnf_b: f32[E]");
    let _ = writeln!(s, "x0 = gather(wte, tokens, 0) + slice(wpe, 0, 0, S)");
    let _ = writeln!(s, "row = reshape(iota(S), [S, 1])\ncol = iota(S)\nmask = where(col > row, -1e9, 0)");
    for b in 0..layers {
        let (x, y) = (format!("x{b}"), format!("x{}", b + 1));
        let _ = writeln!(s, "h_{b} = layernorm({x}, ln1_g_{b}, ln1_b_{b}, 1e-5)");
        for p in ["q", "k", "v"] {
            let _ = writeln!(s, "{p}_{b} = transpose(reshape(h_{b} @ w{p}_{b} + b{p}_{b}, [B, S, H, Dh]), 1, 2)");
        }
        let _ = writeln!(s, "s_{b} = q_{b} @ transpose(k_{b}, -1, -2) * 0.125 + mask");
        let _ = writeln!(s, "e_{b} = exp(s_{b} - amax(s_{b}, -1))");
        let _ = writeln!(s, "p_{b} = e_{b} / sum(e_{b}, -1)");
        let _ = writeln!(s, "a_{b} = reshape(transpose(p_{b} @ v_{b}, 1, 2), [B, S, E])");
        let _ = writeln!(s, "r_{b} = {x} + a_{b} @ wo_{b} + bo_{b}");
        let _ = writeln!(s, "h2_{b} = layernorm(r_{b}, ln2_g_{b}, ln2_b_{b}, 1e-5)");
        let _ = writeln!(s, "{y} = r_{b} + gelu(h2_{b} @ w1_{b} + b1_{b}) @ w2_{b} + b2_{b}");
    }
    let _ = writeln!(s, "xf = reshape(layernorm(x{layers}, lnf_g, lnf_b, 1e-5), [N, E])");
    let _ = writeln!(s, "logits = xf @ transpose(wte, 0, 1)");
    let _ = writeln!(s, "z = logits - amax(logits, -1)");
    let _ = writeln!(s, "logp = z - log(sum(exp(z), -1))");
    let _ = writeln!(s, "loss = reshape(-sum(sum(logp * onehot(targets, V), -1), 0) / N, [])");
    let mut outputs = vec!["loss".to_string()];
    let mut grad = |w: &str| {
        let _ = writeln!(s, "d{w} = grad(loss, {w})");
        outputs.push(format!("d{w}"));
    };
    grad("wte");
    grad("wpe");
    for b in 0..layers {
        for (w, _) in weights(b) {
            grad(&w);
        }
    }
    grad("lnf_g");
    grad("lnf_b");
    let _ = writeln!(s, "output {}", outputs.join(", "));
    s
}
