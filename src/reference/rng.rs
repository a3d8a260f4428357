//! The counter-based random generator: `dropout` masks and seeded program inputs.
//!
//! Invariant: every random bit is a pure function of a 32-bit seed and a 64-bit element index,
//! computed with 32-bit unsigned arithmetic only (wrapping multiply, xor, shift), so that a CUDA
//! kernel reproduces it bit for bit in any thread order. Changing anything here changes every
//! dropout result and every generated input; the known-answer tests catch that.
//!
//! # The generator
//!
//! ```text
//! mix32(x):                       // "lowbias32" (C. Wellons), a bijection on u32
//!     x ^= x >> 16; x *= 0x7feb352d;
//!     x ^= x >> 15; x *= 0x846ca68b;
//!     x ^= x >> 16; return x;     // all multiplies wrap modulo 2^32
//!
//! key(seed, hi) = mix32(mix32(seed ^ 0x9e3779b9) ^ hi)
//! bits(seed, index) = mix32(key(seed, hi) ^ lo)   // lo, hi: the low and high 32 bits of index
//! ```
//!
//! For tensors under 2^32 elements `hi` is 0, so a kernel computes `key` once and spends one
//! `mix32` per element. For a fixed key, `bits` is a permutation of the 2^32 values of `lo`.
//!
//! # Dropout
//!
//! `dropout(x, p, seed)` with `p` in `[0, 1)` and `seed` in `[0, 2^32)`, a literal or the value
//! of an i32 tensor of shape `[]` or `[1]` read as a u32 (a seed given at run time); `i` is the
//! element's flat row-major index in `x` (and in the result, which has the same shape):
//!
//! ```text
//! threshold = floor(p * 2^32)            // computed in f64, exact; at most 2^32 - 1
//! scale     = (float)(1.0 / (1.0 - p))   // computed in f64, then rounded to f32 (nearest)
//! keep(i)   = bits(seed, i) >= threshold // so P(keep) = 1 - threshold / 2^32 ~= 1 - p
//! y[i]      = keep(i) ? to_dtype((float)x[i] * scale) : 0
//! ```
//!
//! The product is one f32 multiply (round to nearest even), then a conversion to the output
//! dtype (round to nearest even; identity for f32). The reference computes exactly that, so a
//! CUDA kernel that receives `threshold` and `scale` as constants from [`dropout_threshold`]
//! and [`dropout_scale`] matches it bit for bit; a kernel with a tensor seed computes
//! `key(seed, 0)` itself from the loaded value (`eq_dropout_seeded`).
//!
//! # Seeded inputs
//!
//! Input number `k` of a program run with seed `s` (a u64) draws from the stream
//! `input_seed(s, k) = mix32(mix32(mix32(lo(s) ^ 0x85ebca6b) ^ hi(s)) ^ (k * 0x9e3779b9))`
//! (k taken modulo 2^32, multiply wrapping). Element `i` then is:
//! - float dtypes: Box–Muller normal(0, 1) from `u1 = (bits(t, 2i) + 0.5) / 2^32` and
//!   `u2 = bits(t, 2i + 1) / 2^32`: `sqrt(-2 ln u1) * cos(2 pi u2)` in f64, rounded to the dtype;
//! - i32: `(bits(t, i) * n) >> 32` (a u64 product), uniform in `[0, n)`, `n = 100` by default;
//! - bool: `bits(t, i) >> 31`.
//!
//! Inputs are generated on the CPU and uploaded, so the GPU never needs this part.

use std::collections::HashMap;

use crate::ir::lang::{Composite, Kind, TensorLang};
use crate::ir::program::Program;
use crate::ir::tensor::Tensor;
use crate::ir::types::{DType, TensorType};

/// Upper bound (exclusive) of generated i32 inputs that no index use constrains.
pub const DEFAULT_INT_BOUND: u32 = 100;

/// The 32-bit finaliser "lowbias32"; a bijection on u32.
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The per-seed key for elements whose index has high word `hi`.
pub fn stream_key(seed: u32, hi: u32) -> u32 {
    mix32(mix32(seed ^ 0x9e37_79b9) ^ hi)
}

/// The random word of element `index` in the stream of `seed`.
pub fn bits(seed: u32, index: u64) -> u32 {
    mix32(stream_key(seed, (index >> 32) as u32) ^ index as u32)
}

/// `floor(p * 2^32)`: an element is kept when its bits are at least this.
pub fn dropout_threshold(p: f64) -> u32 {
    let t = (p.clamp(0.0, 1.0) * 4_294_967_296.0).floor();
    if t >= u32::MAX as f64 {
        u32::MAX
    } else {
        t as u32
    }
}

/// `1 / (1 - p)` rounded to f32: the factor kept elements are multiplied by.
pub fn dropout_scale(p: f64) -> f32 {
    (1.0 / (1.0 - p)) as f32
}

/// Whether dropout keeps element `index`.
pub fn dropout_keep(seed: u32, index: u64, threshold: u32) -> bool {
    bits(seed, index) >= threshold
}

/// Applies dropout to row-major `data` of `dtype` (see the module docs for the exact formula).
pub fn dropout(data: &[f64], dtype: DType, p: f64, seed: u32) -> Vec<f64> {
    let threshold = dropout_threshold(p);
    let scale = dropout_scale(p);
    let key = stream_key(seed, 0);
    data.iter()
        .enumerate()
        .map(|(i, &x)| {
            let i = i as u64;
            let word = if i >> 32 == 0 { mix32(key ^ i as u32) } else { bits(seed, i) };
            if word >= threshold {
                // One f32 multiply, as the CUDA kernel does it.
                dtype.round((x as f32 * scale) as f64)
            } else {
                0.0
            }
        })
        .collect()
}

/// The stream seed of input number `input_index` for run seed `seed`.
pub fn input_seed(seed: u64, input_index: usize) -> u32 {
    let base = mix32(mix32(seed as u32 ^ 0x85eb_ca6b) ^ (seed >> 32) as u32);
    mix32(base ^ (input_index as u32).wrapping_mul(0x9e37_79b9))
}

/// A seeded random input: normal(0, 1) floats, i32 uniform in `[0, 100)`, bool uniform.
pub fn random_input(ty: &TensorType, seed: u64, input_index: usize) -> Tensor {
    random_input_below(ty, seed, input_index, DEFAULT_INT_BOUND)
}

/// As [`random_input`], with i32 values uniform in `[0, int_bound)` (a bound of 0 acts as 1).
pub fn random_input_below(ty: &TensorType, seed: u64, input_index: usize, int_bound: u32) -> Tensor {
    let s = input_seed(seed, input_index);
    match ty.dtype {
        DType::I32 => Tensor::from_fn(ty, |i| uniform_below(bits(s, i as u64), int_bound.max(1)) as f64),
        DType::Bool => Tensor::from_fn(ty, |i| (bits(s, i as u64) >> 31) as f64),
        _ => Tensor::from_fn(ty, |i| normal(bits(s, 2 * i as u64), bits(s, 2 * i as u64 + 1))),
    }
}

fn uniform_below(word: u32, n: u32) -> u32 {
    ((word as u64 * n as u64) >> 32) as u32
}

/// Box–Muller from two words.
fn normal(w1: u32, w2: u32) -> f64 {
    let u1 = (w1 as f64 + 0.5) / 4_294_967_296.0;
    let u2 = w2 as f64 / 4_294_967_296.0;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Seeded inputs for every input of `program`, by name; see [`random_program_input`]. An input
/// whose value the program carries ([`Program::values`], an ONNX weight) gets that value.
pub fn random_inputs(program: &Program, seed: u64) -> HashMap<String, Tensor> {
    let bounds = index_bounds(program);
    (0..program.inputs.len()).map(|k| (program.inputs[k].name.clone(), input_k(program, k, seed, &bounds))).collect()
}

/// The seeded value of input number `k` (declaration order; it uses stream `k`). An i32 input
/// used directly as the indices of `onehot(t, n)` or the targets of `cross_entropy(logits, t)`
/// is drawn from `[0, n)` (the class count, the smallest over such uses), so that it is in range.
/// An input whose value the program carries ([`Program::values`]) gets that value.
/// Panics if `k` is not an input index of `program`.
pub fn random_program_input(program: &Program, k: usize, seed: u64) -> Tensor {
    input_k(program, k, seed, &index_bounds(program))
}

fn input_k(program: &Program, k: usize, seed: u64, bounds: &HashMap<String, u32>) -> Tensor {
    let input = &program.inputs[k];
    if let Some(v) = program.values.get(&input.name) {
        return v.clone();
    }
    let bound = bounds.get(&input.name).copied().unwrap_or(DEFAULT_INT_BOUND);
    random_input_below(&input.ty, seed, k, bound)
}

/// For each input used as class indices, the smallest class count among its uses.
fn index_bounds(program: &Program) -> HashMap<String, u32> {
    let mut bounds: HashMap<String, u32> = HashMap::new();
    for node in program.expr().as_ref() {
        let TensorLang::Op(code, ch) = node else { continue };
        let (index, n) = match code.kind() {
            Kind::OneHot => (ch[0], program.fact(ch[1]).konst.unwrap_or(0.0)),
            Kind::ScatterAdd => (ch[0], program.fact(ch[3]).konst.unwrap_or(0.0)),
            Kind::Gather => {
                let x = program.ty(ch[0]);
                let axis = program.fact(ch[2]).konst.unwrap_or(0.0) as i64;
                let n = x.and_then(|t| crate::ir::infer::norm_axis(axis, t.rank()).ok().map(|a| t.shape[a]));
                (ch[1], n.unwrap_or(0) as f64)
            }
            Kind::Composite(Composite::CrossEntropy) => {
                (ch[1], program.ty(ch[0]).and_then(|t| t.shape.last()).copied().unwrap_or(0) as f64)
            }
            _ => continue,
        };
        if let TensorLang::Var(name) = program.node(index) {
            let n = n.clamp(1.0, u32::MAX as f64) as u32;
            let slot = bounds.entry(name.to_string()).or_insert(n);
            *slot = (*slot).min(n);
        }
    }
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // lowbias32 fixes 0 and is otherwise the published function.
        assert_eq!(mix32(0), 0);
        assert_eq!(mix32(1), KNOWN_MIX32_1);
        assert_eq!(bits(0, 0), KNOWN_BITS_0_0);
        assert_eq!(bits(42, 7), KNOWN_BITS_42_7);
        assert_eq!(bits(42, (1 << 32) + 7), KNOWN_BITS_42_HI);
        assert_eq!(input_seed(1234, 3), KNOWN_INPUT_SEED);
        let first: Vec<u32> = (0..4).map(|i| bits(1, i)).collect();
        assert_eq!(first, vec![0xb98a_617e, 0xc095_1f9f, 0xdbb7_4c9e, 0x9706_d93b]);
    }

    // Computed by an independent Python transcription of the module docs.
    const KNOWN_MIX32_1: u32 = 0x6889_90c0;
    const KNOWN_BITS_0_0: u32 = 0x944f_b554;
    const KNOWN_BITS_42_7: u32 = 0x16d0_a76e;
    const KNOWN_BITS_42_HI: u32 = 0x3920_1fd4;
    const KNOWN_INPUT_SEED: u32 = 0xac37_d80d;

    #[test]
    fn thresholds_and_scales() {
        assert_eq!(dropout_threshold(0.0), 0);
        assert_eq!(dropout_threshold(0.5), 1 << 31);
        assert_eq!(dropout_threshold(0.25), 1 << 30);
        assert_eq!(dropout_threshold(1.0 - f64::EPSILON), u32::MAX);
        assert_eq!(dropout_scale(0.5), 2.0);
        assert_eq!(dropout_scale(0.1), (1.0f64 / 0.9) as f32);
    }

    #[test]
    fn dropout_keeps_about_one_minus_p() {
        let n = 200_000;
        let x = vec![1.0; n];
        for &p in &[0.1, 0.5, 0.9] {
            let y = dropout(&x, DType::F32, p, 7);
            let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
            assert!((kept - (1.0 - p)).abs() < 0.01, "p = {p}: kept {kept}");
            assert!(y.iter().all(|&v| v == 0.0 || v == dropout_scale(p) as f64));
        }
        assert_eq!(dropout(&x[..10], DType::F32, 0.0, 3), x[..10].to_vec());
    }

    #[test]
    fn different_seeds_give_unrelated_masks() {
        let x = vec![1.0; 100_000];
        let a = dropout(&x, DType::F32, 0.5, 1);
        let b = dropout(&x, DType::F32, 0.5, 2);
        let same = a.iter().zip(&b).filter(|(u, v)| u == v).count() as f64 / x.len() as f64;
        assert!((same - 0.5).abs() < 0.01, "masks agree on {same}");
    }

    #[test]
    fn inputs_are_seeded_and_plausible() {
        let ty = TensorType::new(DType::F32, vec![100, 100]);
        let a = random_input(&ty, 5, 0);
        assert_eq!(a, random_input(&ty, 5, 0));
        assert_ne!(a, random_input(&ty, 5, 1));
        assert_ne!(a, random_input(&ty, 6, 0));
        let s = a.summary();
        assert!(s.mean.abs() < 0.05 && s.min < -2.5 && s.max > 2.5, "{s}");
        let var = a.data.iter().map(|v| v * v).sum::<f64>() / a.numel() as f64;
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
        let ints = random_input(&TensorType::new(DType::I32, vec![1000]), 5, 2);
        assert!(ints.data.iter().all(|&v| (0.0..100.0).contains(&v) && v.fract() == 0.0));
        let flags = random_input(&TensorType::new(DType::Bool, vec![1000]), 5, 3);
        let ones = flags.data.iter().sum::<f64>();
        assert!(flags.data.iter().all(|&v| v == 0.0 || v == 1.0) && (400.0..600.0).contains(&ones));
    }
}
