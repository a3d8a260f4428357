//! Planner behaviour on small hand-built programs (no rules needed).

use eqfuse::{optimize, DType, DeviceProfile, OptimizeOptions, Program, Template, TensorType};

fn f32(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

#[test]
fn add_mul_is_one_kernel_with_floor_traffic() {
    let n = 1 << 20;
    let p = Program::from_sexprs(
        "add_mul",
        &[("x", f32(&[n])), ("y", f32(&[n])), ("z", f32(&[n]))],
        &[("out", "(* (+ x y) z)")],
    )
    .unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 1);
    assert_eq!(plan.total.bytes, 4 * n as u64 * 4);
    assert_eq!(plan.unfused.kernels, 2);
    assert_eq!(plan.unfused.bytes, 6 * n as u64 * 4);
    assert_eq!(plan.kernels[0].template, Template::Elementwise);
}

#[test]
fn decomposed_layernorm_is_one_row_kernel() {
    let (r, c) = (4096, 1024);
    let y = "(+ (* (* (- x (mean x -1)) (rsqrt (+ (mean (* (- x (mean x -1)) (- x (mean x -1))) -1) 0.00001))) gamma) beta)";
    let p = Program::from_sexprs("ln", &[("x", f32(&[r, c])), ("gamma", f32(&[c])), ("beta", f32(&[c]))], &[("y", y)])
        .unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].template, Template::RowReduce);
    let floor = (2 * r * c + 2 * c) as u64 * 4;
    assert_eq!(plan.total.bytes, floor);
    assert!(plan.unfused.kernels >= 8);
}

#[test]
fn residual_and_its_norm_share_one_kernel() {
    let (r, c) = (512, 768);
    let h = "(+ x res)";
    let y = "(layernorm (+ x res) g b 0.00001)";
    let p = Program::from_sexprs(
        "res_ln",
        &[("x", f32(&[r, c])), ("res", f32(&[r, c])), ("g", f32(&[c])), ("b", f32(&[c]))],
        &[("h", h), ("y", y)],
    )
    .unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].writes.len(), 2);
}

#[test]
fn two_matmuls_stay_apart_and_bias_relu_fuse_into_the_product() {
    let p = Program::from_sexprs(
        "mlp",
        &[("x", f32(&[256, 512])), ("w1", f32(&[512, 1024])), ("b1", f32(&[1024])), ("w2", f32(&[1024, 64]))],
        &[("y", "(@ (relu (+ (@ x w1) b1)) w2)")],
    )
    .unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 2, "{:#?}", plan.kernels);
    assert!(plan.kernels.iter().all(|k| k.template == Template::Gemm));
}
