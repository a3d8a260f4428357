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
