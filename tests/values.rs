//! Values at the edges (issue 18): sizes the CPU reference cannot hold are refused before
//! anything is allocated, flop counts beyond u64 saturate instead of wrapping to 0, i32
//! arithmetic wraps as two's complement on the reference as it does on the GPU, and infinite
//! constants reach CUDA as expressions NVRTC compiles.

use std::collections::HashMap;

use eqfuse::{
    check_fits, codegen_plan, eval, optimize, parse_program, program_from_json, random_inputs, run_cpu, CpuRunOptions,
    DType, DeviceProfile, OptimizeOptions, Program, Tensor,
};

fn program(src: &str) -> Program {
    parse_program("t.eqf", src, &[]).unwrap()
}

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

#[test]
fn the_cpu_reference_refuses_tensors_it_cannot_hold() {
    let cases = [
        ("input x: f32[1048576, 4096]\ny = x + 1\noutput y\n", "t.eqf: input `x` (f32[1048576,4096]) has 4294967296"),
        (
            "input x: f32[1]\ny = broadcast(x, [65536, 65536])\noutput y\n",
            "t.eqf: `y` (`broadcast`) (f32[65536,65536]) has 4294967296",
        ),
        ("y = iota(281474976710656)\noutput y\n", "t.eqf: `y` (`iota`) (i32[281474976710656]) has 281474976710656"),
    ];
    for (src, want) in cases {
        let p = program(src);
        let err = check_fits(&p).unwrap_err().to_string();
        assert!(err.contains(want) && err.contains("more than the CPU reference holds"), "{err}");
        // The reference itself refuses before evaluating anything.
        let err = eval(&p, &HashMap::new()).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
    // `run --cpu` refuses before generating inputs or writing a file.
    let out = std::env::temp_dir().join(format!("eqfuse-values-{}", std::process::id()));
    let p = program(cases[0].0);
    let opts = CpuRunOptions { inputs_dir: None, outputs_dir: Some(out.clone()), seed: 0 };
    assert!(run_cpu(&p, &opts).unwrap_err().to_string().contains("input `x`"));
    assert!(!out.exists());
}

#[test]
fn huge_shapes_still_plan_and_flops_saturate_instead_of_wrapping() {
    // 2 * M * N * K = 2^73 flops: beyond u64, which wrapped to 0.
    let p = program("dim M = 16777216\ninput a: f32[M, M]\ninput b: f32[M, M]\nc = a @ b\noutput c\n");
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.flops, u64::MAX);
    assert!(plan.kernels.iter().all(|k| k.flops > 0));
    assert_eq!(plan.total.bytes, 3 * 4 * (1u64 << 48));
}

#[test]
fn i32_arithmetic_wraps_as_twos_complement() {
    let p = program(
        "input x: i32[64]\ninput y: i32[64]\n\
         s = x + y\nd = x - y\nm = x * y\nq = x / y\nn = neg(x)\nsq = square(x)\nt = sum(x * 2147483647, 0)\n\
         output s, d, m, q, n, sq, t\n",
    );
    let mut inputs = random_inputs(&p, 1);
    // Values near the ends of the range, so that every op overflows somewhere.
    let edge =
        |k: i64| (0..64).map(move |i| [i32::MAX as i64, i32::MIN as i64, 1 << 20, -3, 0, -1][(i + k) as usize % 6]);
    let x: Vec<i64> = edge(0).collect();
    let y: Vec<i64> = edge(1).collect();
    inputs.insert("x".into(), Tensor::new(DType::I32, vec![64], x.iter().map(|&v| v as f64).collect()).unwrap());
    inputs.insert("y".into(), Tensor::new(DType::I32, vec![64], y.iter().map(|&v| v as f64).collect()).unwrap());
    let out = eval(&p, &inputs).unwrap();
    let (xi, yi): (Vec<i32>, Vec<i32>) = (x.iter().map(|&v| v as i32).collect(), y.iter().map(|&v| v as i32).collect());
    let want = |f: &dyn Fn(i32, i32) -> i32| xi.iter().zip(&yi).map(|(&a, &b)| f(a, b) as f64).collect::<Vec<_>>();
    assert_eq!(out[0].data, want(&|a, b| a.wrapping_add(b)));
    assert_eq!(out[1].data, want(&|a, b| a.wrapping_sub(b)));
    assert_eq!(out[2].data, want(&|a, b| a.wrapping_mul(b)));
    assert_eq!(out[3].data, want(&|a, b| if b == 0 { 0 } else { a.wrapping_div(b) }));
    assert_eq!(out[4].data, want(&|a, _| a.wrapping_neg()));
    assert_eq!(out[5].data, want(&|a, _| a.wrapping_mul(a)));
    let total = xi.iter().fold(0i32, |s, &a| s.wrapping_add(a.wrapping_mul(i32::MAX)));
    assert_eq!(out[6].data, vec![total as f64]);
    // A conversion from a float saturates, as CUDA's does.
    let c = program("input x: f32[2]\ny = cast(x, i32)\noutput y\n");
    let xs = Tensor::new(DType::F32, vec![2], vec![3e9, -3e9]).unwrap();
    let out = eval(&c, &HashMap::from([("x".to_string(), xs)])).unwrap();
    assert_eq!(out[0].data, vec![i32::MAX as f64, i32::MIN as f64]);
}

/// Infinite constants (constant folding past f32's range, a `-inf` mask fill from a JSON or ONNX
/// graph), an output sharing its name with a node, and an input passed through as an output:
/// every kernel codegen emits for them compiles with NVRTC.
#[test]
fn kernels_with_infinities_and_passed_through_inputs_compile() {
    let mut programs = vec![
        // `(x * 1e30) * 1e30` reassociates to `x * 1e60`, an f32 infinity.
        program("input x: f32[64]\ny = x * 1e30 * 1e30\nz = x * -1e30 * 1e30\noutput y, z\n"),
        program("input x: i32[64]\ny = x * -2147483648 + 2147483647\noutput y\n"),
    ];
    let graph = |nodes: &str, outputs: &str| {
        program_from_json(
            "g.json",
            &format!(
                r#"{{"schema": "eqfuse.graph/1", "inputs": [{{"name": "x", "dtype": "f32", "shape": [64]}}],
                "nodes": [{{"op": "input", "value": "x"}}, {nodes}], "outputs": [{outputs}]}}"#
            ),
        )
        .unwrap()
    };
    let mask = r#"{"op": "const", "value": 0}, {"op": ">", "args": [0, 1]}, {"op": "const", "value": "-inf"},
        {"op": "where", "args": [2, 0, 3], "name": "x_masked"}, {"op": "const", "value": "inf"},
        {"op": "min", "args": [4, 5]}, {"op": "exp", "args": [6]}"#;
    programs.push(graph(mask, r#"{"name": "y", "node": 7}"#));
    // The input passed through beside a computed output, and a node named like an output.
    programs
        .push(graph(mask, r#"{"name": "x", "node": 0}, {"name": "x_masked", "node": 7}, {"name": "m", "node": 4}"#));
    programs.push(graph(mask, r#"{"name": "out", "node": 0}, {"name": "y", "node": 6}"#));
    let nan = r#"{"op": "const", "value": "nan"}, {"op": "max", "args": [0, 1]}"#;
    programs.push(graph(nan, r#"{"name": "y", "node": 2}"#));
    let nvrtc = eqfuse::nvrtc_available().is_ok();
    if !nvrtc {
        eprintln!("NVRTC is not available: kernels are generated, not compiled");
    }
    for p in &mut programs {
        let plan = optimize(p, &opts()).unwrap().plan;
        for s in codegen_plan(&plan).unwrap() {
            assert!(!s.source.contains("inff") && !s.source.contains("NaNf"), "{}", s.source);
            let args = s.source.lines().find(|l| l.starts_with("#define EQ_ARGS")).unwrap_or_default().to_string();
            let mut names: Vec<&str> = args.split([' ', ',']).filter(|a| a.starts_with("p_")).collect();
            let n = names.len();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), n, "a duplicate kernel parameter: {args}");
            if nvrtc {
                let c = eqfuse::nvrtc_compile(&s.source, &s.file, eqfuse::DEFAULT_ARCH, &[])
                    .unwrap_or_else(|e| panic!("{} / {}: {e}\n{}", p.source, s.name, s.source));
                assert!(c.log.trim().is_empty(), "{}: warnings\n{}", s.name, c.log);
            }
        }
        // The reference agrees that the values are infinite where the program says so.
        eval(p, &random_inputs(p, 0)).unwrap();
    }
}

/// The command line: an unsound rule in `--rules DIR` and a tensor the CPU reference cannot
/// hold are each an error naming the place, exit status 1, never a panic or an abort.
#[test]
fn the_command_line_refuses_unsound_rules_and_tensors_too_large_for_the_cpu() {
    let dir = std::env::temp_dir().join(format!("eqfuse-values-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("algebra.rules"), "(rewrite add-to-mul (+ ?x ?y) (* ?x ?y))\n").unwrap();
    std::fs::write(dir.join("big.eqf"), "input x: f32[65536, 65536]\ny = exp(x)\noutput y\n").unwrap();
    let eqfuse = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_eqfuse")).args(args).output().unwrap();
    let rules = dir.to_str().unwrap();
    let out = eqfuse(&["optimize", "examples/layernorm.eqf", "--rules", rules]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rule `add-to-mul` (") && stderr.contains("algebra.rules:1) is unsound"), "{stderr}");
    let big = dir.join("big.eqf");
    let outputs = dir.join("out");
    let out = eqfuse(&["run", "--cpu", big.to_str().unwrap(), "--outputs", outputs.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("input `x` (f32[65536,65536]) has 4294967296 elements"), "{stderr}");
    assert!(!outputs.exists());
    // Planning the same program is fine: only evaluating it on the CPU is refused.
    assert_eq!(eqfuse(&["optimize", big.to_str().unwrap()]).status.code(), Some(0));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn json_graph_constants_are_read_exactly() {
    // serde_json's default float parser may land one unit in the last place off: f32's
    // largest value, written as its shortest decimal, read as the f64 above it, made
    // `x >= f32::MAX` false for x = f32::MAX (the exporter's spelling of an infinite literal).
    for v in [
        f32::MAX as f64,
        -(f32::MAX as f64),
        0.1,
        1e-300,
        2.2250738585072014e-308,
        9007199254740993.0,
        0.30000000000000004,
        123456.789e-7,
    ] {
        let text = format!(
            r#"{{"schema": "eqfuse.graph/1", "inputs": [{{"name": "x", "dtype": "f32", "shape": [4]}}],
            "nodes": [{{"op": "input", "value": "x"}}, {{"op": "const", "value": {v:?}}}, {{"op": ">=", "args": [0, 1]}}],
            "outputs": [{{"name": "y", "node": 2}}]}}"#
        );
        let p = program_from_json("g.json", &text).unwrap();
        let json = eqfuse::program_to_json(&p);
        let read =
            json["nodes"].as_array().unwrap().iter().find(|n| n["op"] == "const").unwrap()["value"].as_f64().unwrap();
        assert_eq!(read.to_bits(), v.to_bits(), "{v:?} read as {read:?}");
    }
}

#[test]
fn rounding_functions_on_the_reference_and_their_kernels_compile() {
    // Halves round to even (`torch.round`, CUDA's `rintf`); -0.5 rounds to -0.
    let p = program(
        "input x: f32[8]\nf = floor(x)\nc = ceil(x)\nr = round(x)\nt = trunc(x)\n\
         m = x - floor(x / 0.75) * 0.75\noutput f, c, r, t, m\n",
    );
    let xs = vec![2.5, -2.5, 1.5, -0.5, 0.49999997, -1.7, 3.0, -0.0];
    let x = Tensor::new(DType::F32, vec![8], xs.clone()).unwrap();
    let out = eval(&p, &HashMap::from([("x".to_string(), x)])).unwrap();
    assert_eq!(out[0].data, vec![2.0, -3.0, 1.0, -1.0, 0.0, -2.0, 3.0, -0.0]);
    assert_eq!(out[1].data, vec![3.0, -2.0, 2.0, -0.0, 1.0, -1.0, 3.0, -0.0]);
    assert_eq!(out[2].data, vec![2.0, -2.0, 2.0, -0.0, 0.0, -2.0, 3.0, -0.0]);
    assert_eq!(out[3].data, vec![2.0, -2.0, 1.0, -0.0, 0.0, -1.0, 3.0, -0.0]);
    assert!(out[4].data.iter().all(|&m| (0.0..0.75).contains(&m)), "{:?}", out[4].data);
    let plan = optimize(&p, &opts()).unwrap().plan;
    let sources = codegen_plan(&plan).unwrap();
    for name in ["floorf", "ceilf", "rintf", "truncf"] {
        assert!(sources.iter().any(|s| s.source.contains(name)), "{name}");
    }
    if eqfuse::nvrtc_available().is_ok() {
        for s in &sources {
            let c = eqfuse::nvrtc_compile(&s.source, &s.file, eqfuse::DEFAULT_ARCH, &[]).unwrap();
            assert!(c.log.trim().is_empty(), "{}: warnings\n{}", s.name, c.log);
        }
    }
}
