//! Hand-computed and independently computed cases for every operator of the CPU reference,
//! for `.npy` reading and writing, and for the `run --cpu` library entry point.

use std::collections::HashMap;
use std::path::Path;

use egg::Id;

use eqfuse::random::{bits, dropout_keep, dropout_scale, dropout_threshold};
use eqfuse::{
    eval, eval_all, random_input, read_npy, run_cpu, write_npy, Binary, Composite, CpuRunOptions, DType, Dims, Kind,
    Program, Reduce, Tensor, TensorLang, TensorType, Unary,
};

// ---------------------------------------------------------------------------------------------
// Helpers

fn ty(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dtype, shape.to_vec())
}

fn tensor(dtype: DType, shape: &[usize], data: &[f64]) -> Tensor {
    Tensor::new(dtype, shape.to_vec(), data.to_vec()).unwrap()
}

fn f32t(shape: &[usize], data: &[f64]) -> Tensor {
    tensor(DType::F32, shape, data)
}

/// A program under construction together with the values of its inputs.
struct Case {
    p: Program,
    inputs: HashMap<String, Tensor>,
}

impl Case {
    fn new() -> Case {
        Case { p: Program::new("test"), inputs: HashMap::new() }
    }

    fn input(&mut self, name: &str, t: Tensor) -> Id {
        let id = self.p.add_input(name, t.ty()).unwrap();
        self.inputs.insert(name.to_string(), t);
        id
    }

    fn random(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Id {
        let k = self.inputs.len();
        self.input(name, random_input(&ty(dtype, shape), 11, k))
    }

    fn num(&mut self, v: f64) -> Id {
        self.p.num(v)
    }

    fn op(&mut self, kind: Kind, children: &[Id]) -> Id {
        self.p.apply(kind, children.to_vec()).unwrap()
    }

    fn un(&mut self, u: Unary, x: Id) -> Id {
        self.op(Kind::Unary(u), &[x])
    }

    fn bin(&mut self, b: Binary, x: Id, y: Id) -> Id {
        self.op(Kind::Binary(b), &[x, y])
    }

    fn reduce(&mut self, r: Reduce, x: Id, axis: i64) -> Id {
        let a = self.num(axis as f64);
        self.op(Kind::Reduce(r), &[x, a])
    }

    fn dims(&mut self, d: &[usize]) -> Id {
        self.p.add(TensorLang::Dims(Dims(d.to_vec()))).unwrap()
    }

    /// Evaluates the given nodes as outputs.
    fn eval(&self, outs: &[Id]) -> Vec<Tensor> {
        let mut p = self.p.clone();
        for (k, &id) in outs.iter().enumerate() {
            p.add_output(&format!("out{k}"), id).unwrap();
        }
        eval(&p, &self.inputs).unwrap()
    }

    fn eval1(&self, out: Id) -> Tensor {
        self.eval(&[out]).remove(0)
    }

    fn eval_err(&self, out: Id) -> String {
        let mut p = self.p.clone();
        p.add_output("out", out).unwrap();
        eval(&p, &self.inputs).unwrap_err().to_string()
    }

    fn value(&self, name: &str) -> &Tensor {
        &self.inputs[name]
    }
}

fn assert_close(got: &Tensor, want: &[f64], rtol: f64) {
    let want = Tensor { dtype: got.dtype, shape: got.shape.clone(), data: want.to_vec() };
    let cmp = got.compare(&want, rtol, rtol);
    assert!(cmp.ok(), "{cmp}\n got {:?}\nwant {:?}", got.data, want.data);
}

fn f32r(v: f64) -> f64 {
    v as f32 as f64
}

// ---------------------------------------------------------------------------------------------
// Pointwise operators

#[test]
fn unary_ops_by_hand() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[4], &[-2.0, 0.0, 1.0, 4.0]));
    let cases: &[(Unary, [f64; 4])] = &[
        (Unary::Neg, [2.0, 0.0, -1.0, -4.0]),
        (Unary::Abs, [2.0, 0.0, 1.0, 4.0]),
        (Unary::Relu, [0.0, 0.0, 1.0, 4.0]),
        (Unary::Square, [4.0, 0.0, 1.0, 16.0]),
        (Unary::Exp, [f32r((-2f64).exp()), 1.0, f32r(1f64.exp()), f32r(4f64.exp())]),
        (Unary::Tanh, [f32r((-2f64).tanh()), 0.0, f32r(1f64.tanh()), f32r(4f64.tanh())]),
        (
            Unary::Sigmoid,
            [f32r(1.0 / (1.0 + 2f64.exp())), 0.5, f32r(1.0 / (1.0 + (-1f64).exp())), f32r(1.0 / (1.0 + (-4f64).exp()))],
        ),
        (Unary::Sin, [f32r((-2f64).sin()), 0.0, f32r(1f64.sin()), f32r(4f64.sin())]),
        (Unary::Cos, [f32r((-2f64).cos()), 1.0, f32r(1f64.cos()), f32r(4f64.cos())]),
    ];
    for (u, want) in cases {
        let y = c.un(*u, x);
        assert_eq!(c.eval1(y).data, want.to_vec(), "{u:?}");
    }
    let pos = c.input("p", f32t(&[3], &[0.25, 1.0, 4.0]));
    let sqrt = c.un(Unary::Sqrt, pos);
    let rsqrt = c.un(Unary::Rsqrt, pos);
    let recip = c.un(Unary::Recip, pos);
    let log = c.un(Unary::Log, pos);
    let out = c.eval(&[sqrt, rsqrt, recip, log]);
    assert_eq!(out[0].data, vec![0.5, 1.0, 2.0]);
    assert_eq!(out[1].data, vec![2.0, 1.0, 0.5]);
    assert_eq!(out[2].data, vec![4.0, 1.0, 0.25]);
    assert_eq!(out[3].data, vec![f32r(0.25f64.ln()), 0.0, f32r(4f64.ln())]);
    // log of 0 and of a negative follow IEEE.
    let z = c.input("z", f32t(&[2], &[0.0, -1.0]));
    let lz = c.un(Unary::Log, z);
    let v = c.eval1(lz);
    assert_eq!(v.data[0], f64::NEG_INFINITY);
    assert!(v.data[1].is_nan());
}

#[test]
fn gelu_family_matches_formulas() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[3], &[-1.0, 0.5, 2.0]));
    let g = c.un(Unary::Gelu, x);
    let gt = c.un(Unary::GeluTanh, x);
    let s = c.un(Unary::Silu, x);
    let e = c.un(Unary::Erf, x);
    let out = c.eval(&[g, gt, s, e]);
    let xs = [-1.0f64, 0.5, 2.0];
    let erf = |v: f64| libm_erf(v);
    let want_g: Vec<f64> = xs.iter().map(|&v| f32r(0.5 * v * (1.0 + erf(v / 2f64.sqrt())))).collect();
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let want_gt: Vec<f64> =
        xs.iter().map(|&v| f32r(0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh()))).collect();
    let want_s: Vec<f64> = xs.iter().map(|&v| f32r(v / (1.0 + (-v).exp()))).collect();
    assert_close(&out[0], &want_g, 1e-6);
    assert_close(&out[1], &want_gt, 1e-6);
    assert_close(&out[2], &want_s, 1e-6);
    assert_close(&out[3], &xs.map(erf), 1e-6);
}

/// erf by its series (independent of libm), accurate far beyond f32 for |x| <= 2.
fn libm_erf(x: f64) -> f64 {
    let mut sum = 0.0;
    let mut term = x;
    for n in 0..60 {
        sum += term / (2 * n + 1) as f64;
        term *= -x * x / (n + 1) as f64;
    }
    2.0 / std::f64::consts::PI.sqrt() * sum
}

#[test]
fn binary_ops_broadcast_like_numpy() {
    let mut c = Case::new();
    let a = c.input("a", f32t(&[2, 1], &[1.0, 2.0]));
    let b = c.input("b", f32t(&[3], &[10.0, 20.0, 30.0]));
    let add = c.bin(Binary::Add, a, b);
    let sub = c.bin(Binary::Sub, b, a);
    let mul = c.bin(Binary::Mul, a, b);
    let div = c.bin(Binary::Div, a, b);
    let out = c.eval(&[add, sub, mul, div]);
    assert_eq!(out[0].shape, vec![2, 3]);
    assert_eq!(out[0].data, vec![11., 21., 31., 12., 22., 32.]);
    assert_eq!(out[1].data, vec![9., 19., 29., 8., 18., 28.]);
    assert_eq!(out[2].data, vec![10., 20., 30., 20., 40., 60.]);
    assert_eq!(out[3].data, [0.1, 0.05, 1.0 / 30.0, 0.2, 0.1, 2.0 / 30.0].map(f32r).to_vec());
    // Rank-3 against rank-1 and a middle broadcast axis.
    let x = c.input("x", f32t(&[2, 1, 2], &[1., 2., 3., 4.]));
    let y = c.input("y", f32t(&[3, 1], &[100., 200., 300.]));
    let s = c.bin(Binary::Add, x, y);
    let v = c.eval1(s);
    assert_eq!(v.shape, vec![2, 3, 2]);
    assert_eq!(v.data, vec![101., 102., 201., 202., 301., 302., 103., 104., 203., 204., 303., 304.]);
}

#[test]
fn max_min_pow_and_weak_constants() {
    let mut c = Case::new();
    let a = c.input("a", f32t(&[3], &[-1.0, 2.0, 3.0]));
    let b = c.input("b", f32t(&[3], &[0.0, 5.0, 1.0]));
    let mx = c.bin(Binary::Max, a, b);
    let mn = c.bin(Binary::Min, a, b);
    let two = c.num(2.0);
    let pw = c.bin(Binary::Pow, a, two);
    let tenth = c.num(0.1);
    let scaled = c.bin(Binary::Mul, a, tenth);
    let out = c.eval(&[mx, mn, pw, scaled]);
    assert_eq!(out[0].data, vec![0.0, 5.0, 3.0]);
    assert_eq!(out[1].data, vec![-1.0, 2.0, 1.0]);
    assert_eq!(out[2].data, vec![1.0, 4.0, 9.0]);
    // The weak 0.1 is exact; only the product is rounded to f32.
    assert_eq!(out[3].data, vec![f32r(-0.1), f32r(0.2), f32r(3.0 * 0.1)]);
    assert_eq!(out[3].dtype, DType::F32);
}

#[test]
fn weak_literal_outputs_are_f32() {
    let mut c = Case::new();
    let a = c.num(0.1);
    let b = c.num(3.0);
    let m = c.bin(Binary::Mul, a, b);
    let v = c.eval1(m);
    assert_eq!((v.dtype, v.shape.clone(), v.data.clone()), (DType::F32, vec![], vec![f32r(0.1 * 3.0)]));
}

#[test]
fn comparisons_give_bool() {
    let mut c = Case::new();
    let a = c.input("a", f32t(&[3], &[1.0, 2.0, 3.0]));
    let two = c.num(2.0);
    let kinds = [
        (Binary::Lt, [1., 0., 0.]),
        (Binary::Le, [1., 1., 0.]),
        (Binary::Gt, [0., 0., 1.]),
        (Binary::Ge, [0., 1., 1.]),
        (Binary::Eq, [0., 1., 0.]),
        (Binary::Ne, [1., 0., 1.]),
    ];
    for (b, want) in kinds {
        let y = c.bin(b, a, two);
        let v = c.eval1(y);
        assert_eq!(v.dtype, DType::Bool);
        assert_eq!(v.data, want.to_vec(), "{b:?}");
    }
    let m = c.bin(Binary::Gt, a, two);
    let not = c.un(Unary::Not, m);
    assert_eq!(c.eval1(not).data, vec![1., 1., 0.]);
}

#[test]
fn integer_arithmetic_truncates() {
    let mut c = Case::new();
    let a = c.input("a", tensor(DType::I32, &[4], &[7., -7., 7., 9.]));
    let b = c.input("b", tensor(DType::I32, &[4], &[2., 2., -2., 0.]));
    let div = c.bin(Binary::Div, a, b);
    let mul = c.bin(Binary::Mul, a, b);
    let three = c.num(3.0);
    let add = c.bin(Binary::Add, a, three);
    let neg = c.un(Unary::Neg, a);
    let out = c.eval(&[div, mul, add, neg]);
    assert_eq!(out[0].dtype, DType::I32);
    assert_eq!(out[0].data, vec![3., -3., -3., 0.]);
    assert_eq!(out[1].data, vec![14., -14., -14., 0.]);
    assert_eq!(out[2].data, vec![10., -4., 10., 12.]);
    assert_eq!(out[3].data, vec![-7., 7., -7., -9.]);
    let s = c.reduce(Reduce::Sum, a, 0);
    assert_eq!(c.eval1(s).data, vec![16.]);
}

#[test]
fn where_broadcasts_all_three() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[2, 2], &[1., -2., -3., 4.]));
    let zero = c.num(0.0);
    let cond = c.bin(Binary::Gt, x, zero);
    let alt = c.input("alt", f32t(&[2, 1], &[10., 20.]));
    let w = c.op(Kind::Where, &[cond, x, alt]);
    assert_eq!(c.eval1(w).data, vec![1., 10., 20., 4.]);
    let flag = c.input("flag", tensor(DType::Bool, &[2], &[1., 0.]));
    let half = c.num(0.5);
    let w2 = c.op(Kind::Where, &[flag, x, half]);
    let v = c.eval1(w2);
    assert_eq!(v.shape, vec![2, 2]);
    assert_eq!(v.data, vec![1., 0.5, -3., 0.5]);
}

#[test]
fn casts_round_to_the_target() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[4], &[-2.7, 0.0, 1.5, 1.0 + 1.0 / 512.0]));
    let t = |c: &mut Case, d: DType| {
        let a = c.p.add(TensorLang::Type(d)).unwrap();
        c.op(Kind::Cast, &[x, a])
    };
    let i = t(&mut c, DType::I32);
    let b = t(&mut c, DType::Bool);
    let h = t(&mut c, DType::Bf16);
    let out = c.eval(&[i, b, h]);
    assert_eq!((out[0].dtype, out[0].data.clone()), (DType::I32, vec![-2., 0., 1., 1.]));
    assert_eq!(out[1].data, vec![1., 0., 1., 1.]);
    assert_eq!(out[2].data, vec![-2.703125, 0., 1.5, 1.0]);
    // bf16 rounding happens at every node of a bf16 program.
    let mut c = Case::new();
    let x = c.input("x", tensor(DType::Bf16, &[1], &[1.0]));
    let eps = c.num(1.0 / 512.0);
    let y = c.bin(Binary::Add, x, eps);
    assert_eq!(c.eval1(y).data, vec![1.0]);
}

// ---------------------------------------------------------------------------------------------
// Reductions and layout

#[test]
fn reductions_keep_the_axis() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[2, 3], &[1., 5., 3., -4., 2., 0.]));
    let sum0 = c.reduce(Reduce::Sum, x, 0);
    let sum1 = c.reduce(Reduce::Sum, x, -1);
    let mean1 = c.reduce(Reduce::Mean, x, 1);
    let max0 = c.reduce(Reduce::Amax, x, -2);
    let min1 = c.reduce(Reduce::Amin, x, 1);
    let out = c.eval(&[sum0, sum1, mean1, max0, min1]);
    assert_eq!((out[0].shape.clone(), out[0].data.clone()), (vec![1, 3], vec![-3., 7., 3.]));
    assert_eq!((out[1].shape.clone(), out[1].data.clone()), (vec![2, 1], vec![9., -2.]));
    assert_eq!(out[2].data, vec![3., f32r(-2.0 / 3.0)]);
    assert_eq!(out[3].data, vec![1., 5., 3.]);
    assert_eq!(out[4].data, vec![1., -4.]);
    // A middle axis of a rank-3 tensor.
    let y = c.input("y", f32t(&[2, 3, 2], &(0..12).map(f64::from).collect::<Vec<_>>()));
    let s = c.reduce(Reduce::Sum, y, 1);
    let v = c.eval1(s);
    assert_eq!((v.shape, v.data), (vec![2, 1, 2], vec![6., 9., 24., 27.]));
    // A reduced value broadcasts back without ceremony.
    let m = c.reduce(Reduce::Mean, x, -1);
    let centered = c.bin(Binary::Sub, x, m);
    let m1 = f32r(-2.0 / 3.0);
    assert_eq!(c.eval1(centered).data, vec![-2., 2., 0., f32r(-4.0 - m1), f32r(2.0 - m1), f32r(-m1)]);
}

#[test]
fn amax_propagates_nan() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[3], &[1., f64::NAN, 2.]));
    let m = c.reduce(Reduce::Amax, x, 0);
    assert!(c.eval1(m).data[0].is_nan());
}

#[test]
fn transpose_reshape_broadcast() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[2, 3, 2], &(0..12).map(f64::from).collect::<Vec<_>>()));
    let a0 = c.num(0.0);
    let am1 = c.num(-1.0);
    let t = c.op(Kind::Transpose, &[x, a0, am1]);
    let v = c.eval1(t);
    assert_eq!(v.shape, vec![2, 3, 2]);
    // out[i][j][k] = x[k][j][i]
    assert_eq!(v.data, vec![0., 6., 2., 8., 4., 10., 1., 7., 3., 9., 5., 11.]);
    let d = c.dims(&[3, 4]);
    let r = c.op(Kind::Reshape, &[x, d]);
    let v = c.eval1(r);
    assert_eq!((v.shape, v.data[5]), (vec![3, 4], 5.0));
    let row = c.input("row", f32t(&[3], &[1., 2., 3.]));
    let d = c.dims(&[2, 3]);
    let b = c.op(Kind::Broadcast, &[row, d]);
    assert_eq!(c.eval1(b).data, vec![1., 2., 3., 1., 2., 3.]);
    let lit = c.num(0.1);
    let d = c.dims(&[2]);
    let b = c.op(Kind::Broadcast, &[lit, d]);
    assert_eq!(c.eval1(b).data, vec![f32r(0.1); 2], "a broadcast literal is rounded to f32");
}

// ---------------------------------------------------------------------------------------------
// Matrix product

fn naive_matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

#[test]
fn matmul_by_hand() {
    let mut c = Case::new();
    let a = c.input("a", f32t(&[2, 3], &[1., 2., 3., 4., 5., 6.]));
    let b = c.input("b", f32t(&[3, 2], &[7., 8., 9., 10., 11., 12.]));
    let m = c.op(Kind::MatMul, &[a, b]);
    let v = c.eval1(m);
    assert_eq!((v.shape, v.data), (vec![2, 2], vec![58., 64., 139., 154.]));
}

#[test]
fn matmul_batch_axes_broadcast() {
    let mut c = Case::new();
    let a = c.random("a", DType::F32, &[2, 1, 4, 3]);
    let b = c.random("b", DType::F32, &[5, 3, 2]);
    let m = c.op(Kind::MatMul, &[a, b]);
    let v = c.eval1(m);
    assert_eq!(v.shape, vec![2, 5, 4, 2]);
    let (ad, bd) = (&c.value("a").data, &c.value("b").data);
    let mut want = Vec::new();
    for i in 0..2 {
        for j in 0..5 {
            let blk = naive_matmul(&ad[i * 12..(i + 1) * 12], &bd[j * 6..(j + 1) * 6], 4, 3, 2);
            want.extend(blk.into_iter().map(f32r));
        }
    }
    assert_close(&v, &want, 1e-7);
}

// ---------------------------------------------------------------------------------------------
// Index and random operators

#[test]
fn iota_and_onehot() {
    let mut c = Case::new();
    let five = c.num(5.0);
    let i = c.op(Kind::Iota, &[five]);
    let v = c.eval1(i);
    assert_eq!((v.dtype, v.data), (DType::I32, vec![0., 1., 2., 3., 4.]));
    let t = c.input("t", tensor(DType::I32, &[4], &[0., 2., -1., 3.]));
    let three = c.num(3.0);
    let oh = c.op(Kind::OneHot, &[t, three]);
    let v = c.eval1(oh);
    assert_eq!((v.dtype, v.shape.clone()), (DType::F32, vec![4, 3]));
    assert_eq!(v.data, vec![1., 0., 0., 0., 0., 1., 0., 0., 0., 0., 0., 0.]);
}

#[test]
fn dropout_follows_the_documented_generator() {
    let mut c = Case::new();
    let x = c.random("x", DType::F32, &[64, 128]);
    let p = c.num(0.3);
    let seed = c.num(1234.0);
    let d = c.op(Kind::Dropout, &[x, p, seed]);
    let v = c.eval1(d);
    let xs = &c.value("x").data.clone();
    let (th, scale) = (dropout_threshold(0.3), dropout_scale(0.3));
    let mut kept = 0;
    for (i, (&got, &x)) in v.data.iter().zip(xs).enumerate() {
        let keep = bits(1234, i as u64) >= th;
        assert_eq!(keep, dropout_keep(1234, i as u64, th));
        let want = if keep { (x as f32 * scale) as f64 } else { 0.0 };
        assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
        kept += keep as usize;
    }
    let rate = kept as f64 / xs.len() as f64;
    assert!((rate - 0.7).abs() < 0.02, "kept {rate}");
    // Same seed, same mask; p = 0 is the identity.
    assert_eq!(c.eval1(d), v);
    let zero = c.num(0.0);
    let id = c.op(Kind::Dropout, &[x, zero, seed]);
    assert_eq!(&c.eval1(id).data, xs);
}

/// A seed given as an i32 tensor (shape `[]` or `[1]`, an input or an expression) gives the
/// mask of the same seed as a literal; a negative i32 is the seed of its bits as a u32.
#[test]
fn dropout_with_a_tensor_seed_equals_the_literal_seed() {
    let mut c = Case::new();
    let x = c.random("x", DType::F32, &[33, 70]);
    let p = c.num(0.4);
    let s = c.input("s", tensor(DType::I32, &[], &[1234.0]));
    let s1 = c.input("s1", tensor(DType::I32, &[1], &[1233.0]));
    let neg = c.input("m", tensor(DType::I32, &[], &[-5.0]));
    let one = c.num(1.0);
    let s1_plus = c.bin(Binary::Add, s1, one);
    let literal = c.num(1234.0);
    let big = c.num((-5i32) as u32 as f64);
    let outs: Vec<Id> =
        [s, s1_plus, literal, neg, big].into_iter().map(|seed| c.op(Kind::Dropout, &[x, p, seed])).collect();
    let v = c.eval(&outs);
    assert_eq!(v[0], v[2]);
    assert_eq!(v[1], v[2]);
    assert_eq!(v[3], v[4]);
    assert_ne!(v[0], v[3]);
    // A new seed value is a new mask, with no change to the program.
    c.inputs.insert("s".into(), tensor(DType::I32, &[], &[1235.0]));
    assert_ne!(c.eval1(outs[0]), v[0]);
}

#[test]
fn dropout_in_bf16_rounds_the_f32_product() {
    let mut c = Case::new();
    let x = c.random("x", DType::Bf16, &[1000]);
    let p = c.num(0.1);
    let seed = c.num(7.0);
    let d = c.op(Kind::Dropout, &[x, p, seed]);
    let v = c.eval1(d);
    let s = dropout_scale(0.1);
    for (i, (&got, &x)) in v.data.iter().zip(&c.value("x").data).enumerate() {
        let want = if dropout_keep(7, i as u64, dropout_threshold(0.1)) {
            DType::Bf16.round((x as f32 * s) as f64)
        } else {
            0.0
        };
        assert_eq!(got, want);
    }
}

// ---------------------------------------------------------------------------------------------
// Composite operators, against computations written here

fn naive_softmax_rows(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let s: f64 = row.iter().map(|v| v.exp()).sum();
            row.iter().map(move |v| v.exp() / s).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn softmax_last_and_first_axis() {
    let mut c = Case::new();
    let x = c.random("x", DType::F32, &[3, 5]);
    let am1 = c.num(-1.0);
    let a0 = c.num(0.0);
    let s = c.op(Kind::Composite(Composite::Softmax), &[x, am1]);
    let s0 = c.op(Kind::Composite(Composite::Softmax), &[x, a0]);
    let out = c.eval(&[s, s0]);
    let xs = c.value("x").data.clone();
    assert_close(&out[0], &naive_softmax_rows(&xs, 5).into_iter().map(f32r).collect::<Vec<_>>(), 1e-7);
    // Along axis 0: softmax of each column.
    let xt: Vec<f64> = (0..15).map(|i| xs[(i % 3) * 5 + i / 3]).collect();
    let st = naive_softmax_rows(&xt, 3);
    let want: Vec<f64> = (0..15).map(|i| f32r(st[(i % 5) * 3 + i / 5])).collect();
    assert_close(&out[1], &want, 1e-7);
}

#[test]
fn log_softmax_is_stable_and_matches_its_decomposition() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[2, 3], &[1000., 1001., 1002., -5., 0., 5.]));
    let am1 = c.num(-1.0);
    let ls = c.op(Kind::Composite(Composite::LogSoftmax), &[x, am1]);
    // Decomposition: x - max - log(sum(exp(x - max)))
    let m = c.reduce(Reduce::Amax, x, -1);
    let xm = c.bin(Binary::Sub, x, m);
    let e = c.un(Unary::Exp, xm);
    let s = c.reduce(Reduce::Sum, e, -1);
    let l = c.un(Unary::Log, s);
    let dec = c.bin(Binary::Sub, xm, l);
    let out = c.eval(&[ls, dec]);
    let lse = |a: f64, b: f64, cc: f64| (a.exp() + b.exp() + cc.exp()).ln();
    let want = [-2.0 - lse(-2., -1., 0.), -1.0 - lse(-2., -1., 0.), -lse(-2., -1., 0.)];
    assert_close(
        &out[0],
        &[want[0], want[1], want[2], -10.0 - lse(-10., -5., 0.), -5.0 - lse(-10., -5., 0.), -lse(-10., -5., 0.)]
            .map(f32r),
        1e-7,
    );
    assert!(out[0].allclose(&out[1], 1e-6, 1e-6), "{}", out[0].compare(&out[1], 1e-6, 1e-6));
}

#[test]
fn layernorm_matches_a_direct_computation_and_the_decomposition() {
    let mut c = Case::new();
    let x = c.random("x", DType::F32, &[4, 16]);
    let g = c.random("g", DType::F32, &[16]);
    let b = c.random("b", DType::F32, &[16]);
    let eps = c.num(1e-5);
    let ln = c.op(Kind::Composite(Composite::LayerNorm), &[x, g, b, eps]);
    let mu = c.reduce(Reduce::Mean, x, -1);
    let xc = c.bin(Binary::Sub, x, mu);
    let sq = c.bin(Binary::Mul, xc, xc);
    let var = c.reduce(Reduce::Mean, sq, -1);
    let ve = c.bin(Binary::Add, var, eps);
    let r = c.un(Unary::Rsqrt, ve);
    let n = c.bin(Binary::Mul, xc, r);
    let ng = c.bin(Binary::Mul, n, g);
    let dec = c.bin(Binary::Add, ng, b);
    let out = c.eval(&[ln, dec]);
    let (xs, gs, bs) = (&c.value("x").data, &c.value("g").data, &c.value("b").data);
    let mut want = Vec::new();
    for row in xs.chunks(16) {
        let mu = row.iter().sum::<f64>() / 16.0;
        let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / 16.0;
        want.extend(row.iter().enumerate().map(|(j, v)| f32r((v - mu) / (var + 1e-5).sqrt() * gs[j] + bs[j])));
    }
    assert_close(&out[0], &want, 1e-7);
    assert!(out[0].allclose(&out[1], 1e-5, 1e-5), "{}", out[0].compare(&out[1], 1e-5, 1e-5));
}

#[test]
fn rmsnorm_matches_a_direct_computation() {
    let mut c = Case::new();
    let x = c.random("x", DType::F32, &[3, 8]);
    let g = c.random("g", DType::F32, &[8]);
    let eps = c.num(1e-6);
    let rn = c.op(Kind::Composite(Composite::RmsNorm), &[x, g, eps]);
    let v = c.eval1(rn);
    let (xs, gs) = (&c.value("x").data, &c.value("g").data);
    let mut want = Vec::new();
    for row in xs.chunks(8) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 8.0;
        want.extend(row.iter().zip(gs).map(|(v, g)| f32r(v / (ms + 1e-6).sqrt() * g)));
    }
    assert_close(&v, &want, 1e-7);
}

#[test]
fn cross_entropy_by_hand_and_out_of_range_targets() {
    let mut c = Case::new();
    let l3 = 3f64.ln();
    let logits = c.input("logits", f32t(&[2, 2], &[0.0, 0.0, l3, 0.0]));
    let t = c.input("t", tensor(DType::I32, &[2], &[1.0, 0.0]));
    let ce = c.op(Kind::Composite(Composite::CrossEntropy), &[logits, t]);
    let v = c.eval1(ce);
    // Row 0: -log(1/2); row 1: -log(3/4) (with ln 3 rounded to f32 in the logits).
    let l3r = f32r(l3);
    let row1 = (l3r.exp() + 1.0).ln() - l3r;
    assert_eq!(v.shape, Vec::<usize>::new());
    assert_close(&v, &[f32r((2f64.ln() + row1) / 2.0)], 1e-7);
    let mut c2 = Case::new();
    let logits = c2.input("logits", f32t(&[1, 2], &[0.0, 0.0]));
    let t = c2.input("t", tensor(DType::I32, &[1], &[2.0]));
    let ce = c2.op(Kind::Composite(Composite::CrossEntropy), &[logits, t]);
    let e = c2.eval_err(ce);
    assert!(e.contains("cross_entropy") && e.contains("target 2"), "{e}");
}

fn naive_attention(q: &[f64], k: &[f64], v: &[f64], s: usize, d: usize, scale: f64, causal: bool) -> Vec<f64> {
    let mut out = vec![0.0; s * d];
    for i in 0..s {
        let scores: Vec<f64> = (0..s)
            .map(|j| (0..d).map(|t| q[i * d + t] * k[j * d + t]).sum::<f64>() * scale)
            .map(|x| x.exp())
            .enumerate()
            .map(|(j, e)| if causal && j > i { 0.0 } else { e })
            .collect();
        let z: f64 = scores.iter().sum();
        for j in 0..s {
            for t in 0..d {
                out[i * d + t] += scores[j] / z * v[j * d + t];
            }
        }
    }
    out
}

#[test]
fn attention_plain_and_causal() {
    let (b, h, s, d) = (2, 2, 5, 4);
    let mut c = Case::new();
    let q = c.random("q", DType::F32, &[b, h, s, d]);
    let k = c.random("k", DType::F32, &[b, h, s, d]);
    let v = c.random("v", DType::F32, &[b, h, s, d]);
    let scale = c.num(0.5);
    let zero = c.num(0.0);
    let one = c.num(1.0);
    let plain = c.op(Kind::Composite(Composite::Attention), &[q, k, v, scale, zero]);
    let causal = c.op(Kind::Composite(Composite::Attention), &[q, k, v, scale, one]);
    let out = c.eval(&[plain, causal]);
    let (qs, ks, vs) = (&c.value("q").data, &c.value("k").data, &c.value("v").data);
    for (o, is_causal) in [(0, false), (1, true)] {
        let mut want = Vec::new();
        for bh in 0..b * h {
            let r = bh * s * d..(bh + 1) * s * d;
            want.extend(naive_attention(&qs[r.clone()], &ks[r.clone()], &vs[r], s, d, 0.5, is_causal));
        }
        assert_close(&out[o], &want.into_iter().map(f32r).collect::<Vec<_>>(), 1e-6);
    }
    // The first query of a causal head sees only the first key: its output is v[0].
    assert_eq!(out[1].data[..d], vs[..d]);
}

#[test]
fn attention_matches_its_decomposition() {
    let mut c = Case::new();
    let q = c.random("q", DType::F32, &[2, 6, 8]);
    let k = c.random("k", DType::F32, &[2, 6, 8]);
    let v = c.random("v", DType::F32, &[2, 6, 3]);
    let scale = c.num(0.25);
    let zero = c.num(0.0);
    let att = c.op(Kind::Composite(Composite::Attention), &[q, k, v, scale, zero]);
    let a1 = c.num(1.0);
    let a2 = c.num(2.0);
    let kt = c.op(Kind::Transpose, &[k, a1, a2]);
    let qk = c.op(Kind::MatMul, &[q, kt]);
    let sc = c.bin(Binary::Mul, qk, scale);
    let am1 = c.num(-1.0);
    let p = c.op(Kind::Composite(Composite::Softmax), &[sc, am1]);
    let dec = c.op(Kind::MatMul, &[p, v]);
    let out = c.eval(&[att, dec]);
    assert_eq!(out[0].shape, vec![2, 6, 3]);
    assert!(out[0].allclose(&out[1], 1e-5, 1e-5), "{}", out[0].compare(&out[1], 1e-5, 1e-5));
}

/// `attention_bias` is the softmax of the scaled scores plus the bias (broadcast from
/// `[B, 1, 1, S]`), causal or not, as its decomposition computes it.
#[test]
fn attention_bias_matches_its_decomposition() {
    for causal in [0.0, 1.0] {
        let mut c = Case::new();
        let q = c.random("q", DType::F32, &[2, 3, 6, 8]);
        let k = c.random("k", DType::F32, &[2, 3, 6, 8]);
        let v = c.random("v", DType::F32, &[2, 3, 6, 4]);
        let b = c.random("b", DType::F32, &[2, 1, 1, 6]);
        let (scale, flag) = (c.num(0.25), c.num(causal));
        let att = c.op(Kind::Composite(Composite::AttentionBias), &[q, k, v, b, scale, flag]);
        let (a1, a2) = (c.num(-1.0), c.num(-2.0));
        let kt = c.op(Kind::Transpose, &[k, a1, a2]);
        let qk = c.op(Kind::MatMul, &[q, kt]);
        let sc = c.bin(Binary::Mul, qk, scale);
        let mut biased = c.bin(Binary::Add, sc, b);
        if causal != 0.0 {
            let (n, m) = (c.num(6.0), c.num(6.0));
            let (iq, ik) = (c.op(Kind::Iota, &[n]), c.op(Kind::Iota, &[m]));
            let d = c.dims(&[6, 1]);
            let row = c.op(Kind::Reshape, &[iq, d]);
            let keep = c.bin(Binary::Ge, row, ik);
            let fill = c.num(-1e30);
            biased = c.op(Kind::Where, &[keep, biased, fill]);
        }
        let am1 = c.num(-1.0);
        let p = c.op(Kind::Composite(Composite::Softmax), &[biased, am1]);
        let dec = c.op(Kind::MatMul, &[p, v]);
        let out = c.eval(&[att, dec]);
        assert_eq!(out[0].shape, vec![2, 3, 6, 4]);
        assert!(out[0].allclose(&out[1], 1e-5, 1e-5), "causal {causal}: {}", out[0].compare(&out[1], 1e-5, 1e-5));
    }
}

/// A key with a bias of -inf gets weight 0; a row whose every key has -inf gives 0 (its softmax is
/// 0/0); a row whose every key has -1e30 gives equal weights (the biased scores are rounded to
/// f32, where -1e30 absorbs them), as the decomposition in f32 gives.
#[test]
fn attention_bias_of_masked_rows() {
    let mut c = Case::new();
    let q = c.random("q", DType::F32, &[3, 4]);
    let k = c.random("k", DType::F32, &[3, 4]);
    let v = c.input("v", f32t(&[3, 2], &[1., 2., 3., 4., 5., 6.]));
    let ninf = f64::NEG_INFINITY;
    let b = c.input("b", f32t(&[3, 3], &[0., ninf, ninf, ninf, ninf, ninf, -1e30, -1e30, -1e30]));
    let (scale, zero) = (c.num(0.5), c.num(0.0));
    let att = c.op(Kind::Composite(Composite::AttentionBias), &[q, k, v, b, scale, zero]);
    let o = c.eval1(att);
    assert_eq!(o.data, vec![1., 2., 0., 0., 3., 4.]);
}

// ---------------------------------------------------------------------------------------------
// Interpreter behaviour

#[test]
fn an_unexpanded_grad_is_refused_with_a_message() {
    let mut c = Case::new();
    let w = c.random("w", DType::F32, &[3]);
    let s = c.reduce(Reduce::Sum, w, 0);
    let g = c.op(Kind::Grad, &[s, w]);
    assert!(c.eval_err(g).contains("must be expanded first (eqfuse::expand_grads)"));
}

#[test]
fn eval_all_skips_dead_nodes_and_attributes() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[2], &[1., 2.]));
    let dead = c.un(Unary::Exp, x);
    let y = c.un(Unary::Neg, x);
    let d = c.dims(&[2, 1]);
    let r = c.op(Kind::Reshape, &[y, d]);
    let mut p = c.p.clone();
    p.add_output("r", r).unwrap();
    let all = eval_all(&p, &c.inputs).unwrap();
    assert_eq!(all.len(), p.len());
    assert!(all[usize::from(dead)].is_none());
    assert!(all[usize::from(d)].is_none());
    assert_eq!(all[usize::from(y)].as_ref().unwrap().data, vec![-1., -2.]);
    assert_eq!(all[usize::from(r)].as_ref().unwrap().shape, vec![2, 1]);
}

#[test]
fn one_node_under_two_output_names() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[2], &[1., 2.]));
    let y = c.un(Unary::Neg, x);
    let mut p = c.p.clone();
    p.add_output("a", y).unwrap();
    p.add_output("b", y).unwrap();
    p.add_output("x", x).unwrap();
    let out = eval(&p, &c.inputs).unwrap();
    assert_eq!(out[0], out[1]);
    assert_eq!(out[2].data, vec![1., 2.]);
}

#[test]
fn empty_tensors_do_not_panic() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[0, 3], &[]));
    let s = c.reduce(Reduce::Sum, x, 0);
    let m = c.reduce(Reduce::Mean, x, 0);
    let sm = {
        let a = c.num(-1.0);
        c.op(Kind::Composite(Composite::Softmax), &[x, a])
    };
    let out = c.eval(&[s, m, sm]);
    assert_eq!(out[0].data, vec![0., 0., 0.]);
    assert!(out[1].data.iter().all(|v| v.is_nan()));
    assert!(out[2].data.is_empty());
    let a = c.input("a", f32t(&[2, 0], &[]));
    let b = c.input("b", f32t(&[0, 2], &[]));
    let mm = c.op(Kind::MatMul, &[a, b]);
    assert_eq!(c.eval1(mm).data, vec![0.; 4]);
}

#[test]
fn inputs_are_rounded_to_their_dtype() {
    let mut c = Case::new();
    let x = c.input("x", f32t(&[1], &[0.0]));
    let y = c.un(Unary::Neg, x);
    let mut inputs = c.inputs.clone();
    inputs.insert("x".into(), Tensor { dtype: DType::F32, shape: vec![1], data: vec![0.1] });
    let mut p = c.p.clone();
    p.add_output("y", y).unwrap();
    assert_eq!(eval(&p, &inputs).unwrap()[0].data, vec![-f32r(0.1)]);
    inputs.insert("x".into(), Tensor { dtype: DType::F32, shape: vec![2], data: vec![0.1] });
    let e = eval(&p, &inputs).unwrap_err().to_string();
    assert!(e.contains("input `x`"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// .npy files

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn npy_round_trips_every_dtype() {
    let dir = temp_dir();
    let cases = [
        tensor(DType::F32, &[2, 3], &[1.5, -2.25, 0.1, 1e30, -0.0, 7.0]),
        tensor(DType::F16, &[3], &[0.1, 65504.0, -3.5]),
        tensor(DType::Bf16, &[2, 2], &[0.1, 3.0e38, -1.0, 1.0 / 3.0]),
        tensor(DType::I32, &[4], &[0.0, -5.0, 2147483647.0, -2147483648.0]),
        tensor(DType::Bool, &[2, 1], &[1.0, 0.0]),
        tensor(DType::F32, &[], &[42.0]),
        tensor(DType::F32, &[0, 4], &[]),
    ];
    for (k, t) in cases.iter().enumerate() {
        let path = dir.path().join(format!("t{k}.npy"));
        write_npy(&path, t).unwrap();
        let back = read_npy(&path, &t.ty()).unwrap();
        assert_eq!(&back, t, "{:?}", t.dtype);
    }
    // A rank no program can declare is refused, and leaves no file.
    let deep = Tensor::new(DType::F32, vec![1; 10_000], vec![1.0]).unwrap();
    let err = write_npy(dir.path().join("deep.npy"), &deep).unwrap_err().to_string();
    assert!(err.contains("rank 10000 has more than 64 axes"), "{err}");
    // Files are written under a temporary name and renamed into place: none is left behind.
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| n.ends_with(".npy")), "{names:?}");
}

/// Writes a raw `.npy` (version 1.0) with the given descr, fortran flag, shape and data bytes.
fn raw_npy(path: &Path, descr: &str, fortran: bool, shape: &str, data: &[u8]) {
    let f = if fortran { "True" } else { "False" };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': {f}, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

/// A header whose sizes multiply beyond 64 bits is an error naming the shape (npyz multiplies
/// them unchecked: it panicked under overflow checks; found by tests/fuzz_cli.rs); zero sizes
/// do not count, so a large empty shape is read as the declared shape it is not.
#[test]
fn npy_refuses_a_shape_whose_size_overflows() {
    let dir = temp_dir();
    let p = dir.path().join("huge.npy");
    for (shape, overflows) in
        [("(4294967296, 4294967296)", true), ("(0, 4294967296, 4294967296)", true), ("(0, 4294967296)", false)]
    {
        raw_npy(&p, "<f4", false, shape, &[]);
        let e = read_npy(&p, &ty(DType::F32, &[2])).unwrap_err().to_string();
        assert!(e.contains("huge.npy"), "{e}");
        assert_eq!(e.contains("more elements than 64 bits count"), overflows, "{shape}: {e}");
    }
}

#[test]
fn npy_accepts_wider_types_and_fortran_order() {
    let dir = temp_dir();
    let p = dir.path().join("f8.npy");
    let data: Vec<u8> = [0.1f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    raw_npy(&p, "<f8", false, "(2,)", &data);
    assert_eq!(read_npy(&p, &ty(DType::F32, &[2])).unwrap().data, vec![f32r(0.1), 2.0]);
    assert_eq!(read_npy(&p, &ty(DType::Bf16, &[2])).unwrap().data, vec![DType::Bf16.round(0.1), 2.0]);

    let p = dir.path().join("i8.npy");
    let data: Vec<u8> = [3i64, -4].iter().flat_map(|v| v.to_le_bytes()).collect();
    raw_npy(&p, "<i8", false, "(2,)", &data);
    assert_eq!(read_npy(&p, &ty(DType::I32, &[2])).unwrap().data, vec![3.0, -4.0]);
    let data: Vec<u8> = [1i64 << 40, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
    raw_npy(&p, "<i8", false, "(2,)", &data);
    let e = read_npy(&p, &ty(DType::I32, &[2])).unwrap_err().to_string();
    assert!(e.contains("i8.npy") && e.contains("does not fit in i32"), "{e}");

    let p = dir.path().join("big.npy");
    let data: Vec<u8> = [1e300f64].iter().flat_map(|v| v.to_le_bytes()).collect();
    raw_npy(&p, "<f8", false, "(1,)", &data);
    assert!(read_npy(&p, &ty(DType::F32, &[1])).unwrap_err().to_string().contains("does not fit in f32"));

    // Column-major [[1, 2, 3], [4, 5, 6]] is stored as 1 4 2 5 3 6.
    let p = dir.path().join("fortran.npy");
    let data: Vec<u8> = [1f32, 4., 2., 5., 3., 6.].iter().flat_map(|v| v.to_le_bytes()).collect();
    raw_npy(&p, "<f4", true, "(2, 3)", &data);
    assert_eq!(read_npy(&p, &ty(DType::F32, &[2, 3])).unwrap().data, vec![1., 2., 3., 4., 5., 6.]);

    let p = dir.path().join("be.npy");
    let data: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_be_bytes()).collect();
    raw_npy(&p, ">f4", false, "(2,)", &data);
    assert_eq!(read_npy(&p, &ty(DType::F32, &[2])).unwrap().data, vec![1.5, -2.0]);
}

#[test]
fn npy_errors_name_the_file_and_the_disagreement() {
    let dir = temp_dir();
    let p = dir.path().join("x.npy");
    write_npy(&p, &f32t(&[2, 3], &[0.; 6])).unwrap();
    let e = read_npy(&p, &ty(DType::F32, &[3, 2])).unwrap_err().to_string();
    assert!(e.contains("x.npy") && e.contains("[2,3]") && e.contains("f32[3,2]"), "{e}");
    let e = read_npy(&p, &ty(DType::I32, &[2, 3])).unwrap_err().to_string();
    assert!(e.contains("x.npy") && e.contains("float32") && e.contains("i32"), "{e}");
    let e = read_npy(dir.path().join("missing.npy"), &ty(DType::F32, &[1])).unwrap_err().to_string();
    assert!(e.contains("missing.npy"), "{e}");
    std::fs::write(&p, b"not numpy").unwrap();
    let e = read_npy(&p, &ty(DType::F32, &[2, 3])).unwrap_err().to_string();
    assert!(e.contains("x.npy") && e.contains("not a valid .npy"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// run --cpu

/// `y = relu(x @ w + b)`, `s = sum(y, -1)`.
fn dense_program() -> Program {
    let mut p = Program::new("dense.eqf");
    let x = p.add_input("x", ty(DType::F32, &[4, 3])).unwrap();
    let w = p.add_input("w", ty(DType::F32, &[3, 2])).unwrap();
    let b = p.add_input("b", ty(DType::F32, &[2])).unwrap();
    let xw = p.apply(Kind::MatMul, vec![x, w]).unwrap();
    let z = p.apply(Kind::Binary(Binary::Add), vec![xw, b]).unwrap();
    let y = p.apply(Kind::Unary(Unary::Relu), vec![z]).unwrap();
    let axis = p.num(-1.0);
    let s = p.apply(Kind::Reduce(Reduce::Sum), vec![y, axis]).unwrap();
    p.add_output("y", y).unwrap();
    p.add_output("s", s).unwrap();
    p
}

#[test]
fn run_cpu_reads_inputs_generates_the_rest_and_writes_outputs() {
    let p = dense_program();
    let inputs = temp_dir();
    let outputs = temp_dir();
    let x: Vec<f64> = (0..12).map(|i| i as f64 * 0.5 - 2.0).collect();
    let w = vec![1.0, -1.0, 0.5, 2.0, -0.25, 0.0];
    write_npy(inputs.path().join("x.npy"), &f32t(&[4, 3], &x)).unwrap();
    write_npy(inputs.path().join("w.npy"), &f32t(&[3, 2], &w)).unwrap();
    let opts = CpuRunOptions {
        inputs_dir: Some(inputs.path().to_path_buf()),
        outputs_dir: Some(outputs.path().to_path_buf()),
        seed: 9,
    };
    let report = run_cpu(&p, &opts).unwrap();
    // `b` was generated and saved beside the outputs.
    let b = read_npy(outputs.path().join("b.npy"), &ty(DType::F32, &[2])).unwrap();
    assert_eq!(b, random_input(&ty(DType::F32, &[2]), 9, 2));
    let mut want_y = Vec::new();
    for i in 0..4 {
        for j in 0..2 {
            let z: f64 = (0..3).map(|k| x[i * 3 + k] * w[k * 2 + j]).sum::<f64>();
            want_y.push(f32r(f32r(f32r(z) + b.data[j]).max(0.0)));
        }
    }
    let want_s: Vec<f64> = want_y.chunks(2).map(|r| f32r(r[0] + r[1])).collect();
    let y = read_npy(outputs.path().join("y.npy"), &ty(DType::F32, &[4, 2])).unwrap();
    let s = read_npy(outputs.path().join("s.npy"), &ty(DType::F32, &[4, 1])).unwrap();
    assert_eq!(y.data, want_y);
    assert_eq!(s.data, want_s);
    let shown = report.to_string();
    for word in ["dense.eqf", "seed 9", "loaded from", "generated, saved to", "f32[4,2]", "y.npy", "s.npy"] {
        assert!(shown.contains(word), "{word} missing from:\n{shown}");
    }
    assert!(!inputs.path().join("b.npy").exists(), "inputs are never written into the inputs folder");

    // Pointing --inputs at the output folder repeats the run exactly, whatever the seed.
    let again = CpuRunOptions {
        inputs_dir: Some(outputs.path().to_path_buf()),
        outputs_dir: Some(outputs.path().to_path_buf()),
        seed: 1,
    };
    let r2 = run_cpu(&p, &again).unwrap();
    assert_eq!(r2.outputs[0].value, y);
    assert!(r2.inputs.iter().all(|i| matches!(i.source, eqfuse::InputSource::Loaded(_))));
}

#[test]
fn run_cpu_reports_bad_input_files() {
    let p = dense_program();
    let inputs = temp_dir();
    let outputs = temp_dir();
    write_npy(inputs.path().join("w.npy"), &f32t(&[2, 3], &[0.; 6])).unwrap();
    let opts = CpuRunOptions {
        inputs_dir: Some(inputs.path().to_path_buf()),
        outputs_dir: Some(outputs.path().join("out")),
        seed: 0,
    };
    let e = run_cpu(&p, &opts).unwrap_err().to_string();
    assert!(e.contains("w.npy") && e.contains("f32[3,2]"), "{e}");
    assert!(!outputs.path().join("out").exists(), "a failed run writes nothing");
}

#[test]
fn generated_class_indices_are_in_range() {
    let mut p = Program::new("ce");
    let logits = p.add_input("logits", ty(DType::F32, &[64, 7])).unwrap();
    let t = p.add_input("t", ty(DType::I32, &[64])).unwrap();
    let ce = p.apply(Kind::Composite(Composite::CrossEntropy), vec![logits, t]).unwrap();
    p.add_output("loss", ce).unwrap();
    let inputs = eqfuse::random_inputs(&p, 3);
    assert!(inputs["t"].data.iter().all(|&v| (0.0..7.0).contains(&v)));
    assert!(eval(&p, &inputs).unwrap()[0].data[0].is_finite());
}

#[test]
fn run_cpu_refuses_a_missing_inputs_folder() {
    let dir = temp_dir();
    let opts =
        CpuRunOptions { inputs_dir: Some(dir.path().join("nope")), outputs_dir: Some(dir.path().join("out")), seed: 0 };
    let e = run_cpu(&dense_program(), &opts).unwrap_err().to_string();
    assert!(e.contains("nope") && e.contains("does not exist"), "{e}");
}

#[test]
fn f16_programs_round_at_every_node() {
    let mut c = Case::new();
    let x = c.input("x", tensor(DType::F16, &[2], &[1000.0, 0.1]));
    let sq = c.un(Unary::Square, x);
    let v = c.eval1(sq);
    // 1000^2 overflows f16; 0.1 is first rounded to f16, then its square is rounded again.
    let tenth = DType::F16.round(0.1);
    assert_eq!(v.data, vec![f64::INFINITY, DType::F16.round(tenth * tenth)]);
    let ax = c.num(0.0);
    let s = c.op(Kind::Reduce(Reduce::Sum), &[sq, ax]);
    assert_eq!(c.eval1(s).data, vec![f64::INFINITY]);
}

// ---------------------------------------------------------------------------------------------
// Indexing: gather, scatter_add, slice, concat (NumPy semantics).

fn eval_text(text: &str, inputs: &[(&str, Tensor)]) -> eqfuse::Result<Vec<Tensor>> {
    let p = eqfuse::parse_program("t.eqf", text, &[])?;
    let inputs: HashMap<String, Tensor> = inputs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    eval(&p, &inputs)
}

#[test]
fn indexing_ops_by_hand() {
    let x = f32t(&[2, 5], &[0., 1., 2., 3., 4., 10., 11., 12., 13., 14.]);
    let head = "input x: f32[2, 5]\ninput t: i32[3]\n";
    let t = tensor(DType::I32, &[3], &[4., -1., 0.]);
    let run = |body: &str| {
        eval_text(&format!("{head}{body}\noutput y\n"), &[("x", x.clone()), ("t", t.clone())])
            .unwrap_or_else(|e| panic!("{body}: {e}"))
            .remove(0)
    };
    let y = run("y = gather(x, t, 1)");
    assert_eq!((y.shape.clone(), y.data.clone()), (vec![2, 3], vec![4., 4., 0., 14., 14., 10.]));
    let y = run("y = gather(x, slice(t, 0, 1, 3), 0)");
    assert_eq!(y.shape, vec![2, 5]);
    assert_eq!(&y.data[..5], &[10., 11., 12., 13., 14.]);
    assert_eq!(&y.data[5..], &[0., 1., 2., 3., 4.]);
    let y = run("y = scatter_add(t, slice(x, 1, 0, 3), 1, 5)");
    assert_eq!(y.data, vec![2., 0., 0., 0., 1., 12., 0., 0., 0., 21.]);
    let y = run("y = slice(x, -1, 1, 100, 2)");
    assert_eq!((y.shape.clone(), y.data.clone()), (vec![2, 2], vec![1., 3., 11., 13.]));
    let y = run("y = slice(x, 0, -1, 2)");
    assert_eq!((y.shape.clone(), y.data.clone()), (vec![1, 5], vec![10., 11., 12., 13., 14.]));
    let y = run("y = concat(slice(x, 1, 3, 5), slice(x, 1, 0, 1), -1)");
    assert_eq!(y.data, vec![3., 4., 0., 13., 14., 10.]);
    let y = run("y = concat(x, x, x, 0)");
    assert_eq!(y.shape, vec![6, 5]);
}

#[test]
fn indexing_errors_name_the_op() {
    let x = f32t(&[2, 5], &[0.; 10]);
    let bad = tensor(DType::I32, &[3], &[4., 5., 0.]);
    let e = eval_text(
        "input x: f32[2, 5]\ninput t: i32[3]\ny = gather(x, t, 1)\noutput y\n",
        &[("x", x.clone()), ("t", bad)],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("gather") && e.contains("index 5 is out of range"), "{e}");
    let parse_err = |body: &str| {
        eqfuse::parse_program(
            "t.eqf",
            &format!("input x: f32[2, 5]\ninput f: f32[3]\ninput t: i32[3]\ny = {body}\noutput y\n"),
            &[],
        )
        .unwrap_err()
        .to_string()
    };
    for (body, want) in [
        ("gather(x, f, 1)", "indices of gather must be i32"),
        ("gather(x, t, 2)", "gather: axis 2 is out of range"),
        ("slice(x, 1, 3, 3)", "empty"),
        ("slice(x, 1, 0, 3, 0)", "step of slice"),
        ("slice(x, -3, 0, 1)", "slice: axis -3"),
        ("concat(x, t, 0)", "concat"),
        ("concat(x, f, 0)", "concat"),
        ("concat(x, x, 2)", "concat: axis 2"),
        ("scatter_add(f, x, 0, 4)", "indices of scatter_add must be i32"),
        ("scatter_add(t, x, 0, 4)", "scatter_add"),
    ] {
        let e = parse_err(body);
        assert!(e.contains(want), "{body}: {e}");
    }
}
