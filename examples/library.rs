//! eqfuse as a library, the way an AD framework or compiler front end would drive it:
//!
//! 1. build a program in code with the [`Program`] builder (inputs, operators, outputs);
//! 2. plan it with [`optimize`] for a device profile, and read the plan (kernels, bytes, the
//!    JSON contract of `docs/plan-schema.md`);
//! 3. evaluate the program and the plan on the CPU reference, and check that they agree.
//!
//! Run it with `cargo run --example library`. Every builder call type-checks the operator it adds
//! and returns an error (a `String`) for a bad one, so a front end reports it instead of crashing.

use std::collections::HashMap;

use eqfuse::{
    check_plan, eval, eval_plan, optimize, plan_json, random_inputs, render, Binary, DType, DeviceProfile, Format,
    Kind, OptimizeOptions, Program, Reduce, TensorType, Unary,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A dense layer with a GELU, a residual connection and a hand-written (decomposed) layer norm:
/// `y = layernorm(x + gelu(x @ w + b))` over the last axis, for `rows` rows of width `d`; the
/// residual `x + gelu(x @ w + b)` is a second output.
fn build(rows: usize, d: usize) -> Res<Program> {
    let f32 = |shape: Vec<usize>| TensorType::new(DType::F32, shape);
    let mut p = Program::new("library-example");
    let x = p.add_input("x", f32(vec![rows, d]))?;
    let w = p.add_input("w", f32(vec![d, d]))?;
    let b = p.add_input("b", f32(vec![d]))?;
    let gamma = p.add_input("gamma", f32(vec![d]))?;
    let beta = p.add_input("beta", f32(vec![d]))?;

    // Operators are added by kind; their children are ids already in the program.
    let xw = p.apply(Kind::MatMul, vec![x, w])?;
    let h = p.apply(Kind::Binary(Binary::Add), vec![xw, b])?;
    let h = p.apply(Kind::Unary(Unary::Gelu), vec![h])?;
    let r = p.apply(Kind::Binary(Binary::Add), vec![x, h])?;
    p.name_node(r, "residual");

    // Attributes are leaf children: an axis is a number (a shape would be a `Dims` node).
    let last = p.num(-1.0);
    let mu = p.apply(Kind::Reduce(Reduce::Mean), vec![r, last])?;
    let xc = p.apply(Kind::Binary(Binary::Sub), vec![r, mu])?;
    let sq = p.apply(Kind::Binary(Binary::Mul), vec![xc, xc])?;
    let var = p.apply(Kind::Reduce(Reduce::Mean), vec![sq, last])?;
    let eps = p.num(1e-5);
    let ve = p.apply(Kind::Binary(Binary::Add), vec![var, eps])?;
    let inv = p.apply(Kind::Unary(Unary::Rsqrt), vec![ve])?;
    let n = p.apply(Kind::Binary(Binary::Mul), vec![xc, inv])?;
    let n = p.apply(Kind::Binary(Binary::Mul), vec![n, gamma])?;
    let y = p.apply(Kind::Binary(Binary::Add), vec![n, beta])?;

    p.name_node(y, "y");
    p.add_output("y", y)?;
    // A second output: the residual, as a framework would keep it for the backward pass.
    p.add_output("residual", r)?;
    Ok(p)
}

fn main() -> Res<()> {
    // A type error is a value, not a panic: `x @ b` multiplies a matrix by a vector.
    let mut bad = Program::new("bad");
    let x = bad.add_input("x", TensorType::new(DType::F32, vec![4, 8]))?;
    let v = bad.add_input("v", TensorType::new(DType::F32, vec![8]))?;
    println!("a bad operator is an error: {}\n", bad.apply(Kind::MatMul, vec![x, v]).unwrap_err());

    // Plan at a realistic size.
    let opts = OptimizeOptions::new(DeviceProfile::load("h100")?);
    let program = build(4096, 1024)?;
    let planned = optimize(&program, &opts)?;
    print!("{}", render(&planned.plan, Format::Table));
    println!("composite operators recognised: {:?}", planned.recognised);
    for k in &planned.plan.kernels {
        let reads: Vec<&str> = k.reads.iter().map(|r| r.name.as_str()).collect();
        let writes: Vec<&str> = k.writes.iter().map(|w| w.name.as_str()).collect();
        println!("kernel {} ({}) reads {reads:?} writes {writes:?}: {}", k.id, k.template.name(), k.body);
    }
    let json = plan_json(&planned.plan);
    println!("plan JSON: schema {}, {} kernels\n", json["schema"], json["total"]["kernels"]);

    // Evaluate at a small size on the CPU reference: the program, the plan kernel by kernel,
    // and the comparison of the two. A framework passes its own tensors by input name.
    let small = build(6, 16)?;
    let plan = optimize(&small, &opts)?.plan;
    let inputs: HashMap<String, eqfuse::Tensor> = random_inputs(&small, 0);
    let outputs = eval(&small, &inputs)?;
    let from_plan = eval_plan(&plan, &inputs)?;
    for ((o, a), b) in small.outputs.iter().zip(&outputs).zip(&from_plan) {
        println!("{}: program {} / plan {}", o.name, a.summary(), b.summary());
    }
    for (name, cmp) in check_plan(&small, &plan, &inputs)? {
        assert!(cmp.ok(), "{name}: {cmp}");
    }
    println!("the plan computes the program");
    Ok(())
}
