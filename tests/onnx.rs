//! ONNX import: models written by the `onnx` package (`tests/onnx/gen_models.py`) load, plan
//! and evaluate on the CPU reference equal to independently computed outputs (NumPy, and onnx's
//! own reference evaluator); unsupported models are errors naming the node; mutated model bytes
//! never panic.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use eqfuse::{
    check_plan, eval, load_program, optimize, program_from_json, program_from_onnx, program_to_json, read_npy,
    tolerance, DeviceProfile, OptimizeOptions, Program, Template, Tensor,
};

const MODELS: &[&str] = &[
    "layernorm",
    "mlp_softmax",
    "ops_shapes",
    "ops_pointwise",
    "ops_indexing",
    "ops_logic",
    "ops_gather",
    "ops_shape_arith",
    "conv_patches",
    "external_data",
    "half",
];

fn dir(model: &str) -> PathBuf {
    Path::new("tests/onnx").join(model)
}

fn load(model: &str, dims: &[(String, usize)]) -> Program {
    let path = dir(model).join("model.onnx");
    load_program(path.to_str().unwrap(), dims).unwrap_or_else(|e| panic!("{model}: {e}"))
}

/// The inputs saved beside the model, plus the weights the program carries.
fn inputs(model: &str, p: &Program) -> HashMap<String, Tensor> {
    let mut out: HashMap<String, Tensor> = p.values.clone().into_iter().collect();
    for i in &p.inputs {
        let file = dir(model).join("inputs").join(format!("{}.npy", i.name));
        if file.is_file() {
            out.insert(i.name.clone(), read_npy(&file, &i.ty).unwrap());
        }
    }
    assert_eq!(out.len(), p.inputs.len(), "{model}: an input has neither a file nor a value");
    out
}

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

#[test]
fn models_evaluate_to_the_independent_results() {
    for model in MODELS {
        let p = load(model, &[]);
        let values = eval(&p, &inputs(model, &p)).unwrap_or_else(|e| panic!("{model}: {e}"));
        for (o, got) in p.outputs.iter().zip(&values) {
            let want = read_npy(dir(model).join("expected").join(format!("{}.npy", o.name)), &got.ty())
                .unwrap_or_else(|e| panic!("{model}/{}: {e}", o.name));
            // A value computed in f16 and cast to f32 carries f16's error.
            let (rtol, atol) = p
                .inputs
                .iter()
                .map(|i| tolerance(i.ty.dtype))
                .fold(tolerance(got.dtype), |a, b| (a.0.max(b.0), a.1.max(b.1)));
            let cmp = got.compare(&want, rtol, atol);
            assert!(cmp.ok(), "{model} output {}: {cmp}", o.name);
        }
    }
}

#[test]
fn plans_compute_the_models() {
    for model in MODELS {
        let p = load(model, &[]);
        let plan = optimize(&p, &opts()).unwrap_or_else(|e| panic!("{model}: {e}")).plan;
        assert!(plan.total.bytes <= plan.unfused.bytes, "{model}");
        for (out, cmp) in check_plan(&p, &plan, &inputs(model, &p)).unwrap() {
            assert!(cmp.ok(), "{model} output {out}: {cmp}");
        }
    }
}

#[test]
fn decomposed_layernorm_plans_as_one_kernel() {
    for dims in [vec![], vec![("batch".to_string(), 4096)]] {
        let p = load("layernorm", &dims);
        let plan = optimize(&p, &opts()).unwrap().plan;
        assert_eq!(plan.kernels.len(), 1, "{dims:?}");
        assert_eq!(plan.kernels[0].template, Template::RowReduce);
        assert_eq!(plan.kernels[0].ops, vec!["layernorm".to_string()]);
        assert_eq!(plan.unfused.kernels, 9);
    }
}

#[test]
fn symbolic_dims_take_the_metadata_default_or_the_override() {
    assert_eq!(load("layernorm", &[]).dims, vec![("batch".to_string(), 16)]);
    let p = load("layernorm", &[("batch".to_string(), 4096)]);
    assert_eq!(p.inputs[0].ty.shape, vec![4096, 64]);
    let e = load_program("tests/onnx/layernorm/model.onnx", &[("seq".into(), 3)]).unwrap_err().to_string();
    assert!(e.contains("has no symbolic dim `seq` (it has batch)"), "{e}");
    let e = load_program("tests/onnx/symbolic.onnx", &[]).unwrap_err().to_string();
    assert!(e.contains("graph input `x`: axis 0 has the symbolic size `n`; give it with --dim n=N"), "{e}");
    let p = load_program("tests/onnx/symbolic.onnx", &[("n".into(), 5)]).unwrap();
    assert_eq!(p.outputs.len(), 1);
    assert_eq!(p.ty(p.outputs[0].id).unwrap().shape, vec![5, 4]);
}

#[test]
fn weights_are_inputs_with_values_and_scalars_are_literals() {
    let p = load("layernorm", &[]);
    let names: Vec<&str> = p.inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["x", "gamma", "beta"]);
    assert_eq!(p.values.keys().collect::<Vec<_>>(), ["beta", "gamma"]);
    // eps and the exponent are literals, as a person would write them.
    let text = p.expr().to_string();
    assert!(text.contains("0.00001") || text.contains("1e-5"), "{text}");
    assert!(text.contains("(pow"), "{text}");
}

#[test]
fn json_export_of_an_imported_model_round_trips() {
    for model in MODELS {
        let p = load(model, &[]);
        let q = program_from_json("m.json", &program_to_json(&p).to_string()).unwrap();
        assert_eq!(p.expr(), q.expr(), "{model}");
    }
}

#[test]
fn unsupported_operators_are_named_together() {
    let e = load_program("tests/onnx/unsupported.onnx", &[]).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "tests/onnx/unsupported.onnx: 2 nodes use operators the ONNX importer does not read (MaxPool, Sign): \
             node 1 `/sign` (Sign), node 2 `/pool/MaxPool` (MaxPool); it reads Add"
        ),
        "{e}"
    );
    let out =
        Command::new(env!("CARGO_BIN_EXE_eqfuse")).args(["optimize", "tests/onnx/unsupported.onnx"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("(MaxPool, Sign)"));
}

#[test]
fn run_cpu_uses_the_model_weights() {
    let out_dir = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_eqfuse"))
        .args(["run", "--cpu", "tests/onnx/mlp_softmax/model.onnx", "--inputs", "tests/onnx/mlp_softmax/inputs"])
        .arg("--outputs")
        .arg(out_dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{stdout}{}", String::from_utf8_lossy(&status.stderr));
    assert!(stdout.contains("from the model"), "{stdout}");
    let ty = eqfuse::TensorType::new(eqfuse::DType::F32, vec![8, 16]);
    let got = read_npy(out_dir.path().join("y.npy"), &ty).unwrap();
    let want = read_npy("tests/onnx/mlp_softmax/expected/y.npy", &ty).unwrap();
    assert!(got.allclose(&want, 1e-5, 1e-5));
}

#[test]
fn external_data_is_read_from_the_model_folder_only() {
    // Loaded from its file, the model reads its weights from `model.onnx.data` beside it
    // (`models_evaluate_to_the_independent_results` checks the values); from bytes alone,
    // with no folder to read them from, it is an error naming the initializer.
    let p = load("external_data", &[]);
    assert_eq!(p.values.len(), 2);
    let bytes = std::fs::read("tests/onnx/external_data/model.onnx").unwrap();
    let e = program_from_onnx("m.onnx", &bytes, &[]).unwrap_err().to_string();
    assert!(e.contains("initializer `w1`: its data is in the external file `model.onnx.data`"), "{e}");
    // A location leaving the model's folder is refused, though the file it names exists.
    let e = load_program("tests/onnx/external_escape/model.onnx", &[]).unwrap_err().to_string();
    assert!(
        e.contains("initializer `w1`: external data location `../external_data/model.onnx.data` is not a file inside"),
        "{e}"
    );
    // So are an absolute location, a range outside the file and a missing file, each an error
    // (never a panic or a read of the claimed size).
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy("tests/onnx/external_data/model.onnx.data", tmp.path().join("model.onnx.data")).unwrap();
    let text = std::fs::read("tests/onnx/external_data/model.onnx").unwrap();
    for (from, to, want) in [
        (&b"model.onnx.data"[..], &b"/etc/passwd0000"[..], "is not a file inside the model's folder"),
        (b"model.onnx.data", b"model.onnx.dat_", "external data `model.onnx.dat_`:"),
    ] {
        let pos = text.windows(from.len()).position(|w| w == from).unwrap();
        let mut bad = text.clone();
        bad[pos..pos + from.len()].copy_from_slice(to);
        let path = tmp.path().join("bad.onnx");
        std::fs::write(&path, &bad).unwrap();
        let e = load_program(path.to_str().unwrap(), &[]).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    // A link inside the folder to a file outside it is refused like a `..`.
    #[cfg(unix)]
    {
        let linked = tempfile::tempdir().unwrap();
        let outside = Path::new("tests/onnx/external_data/model.onnx.data").canonicalize().unwrap();
        std::os::unix::fs::symlink(outside, linked.path().join("model.onnx.data")).unwrap();
        std::fs::write(linked.path().join("model.onnx"), &text).unwrap();
        let e = load_program(linked.path().join("model.onnx").to_str().unwrap(), &[]).unwrap_err().to_string();
        assert!(e.contains("external data location `model.onnx.data` leads out of the model's folder"), "{e}");
    }
    // A truncated data file: the offsets point past its end.
    std::fs::write(tmp.path().join("model.onnx.data"), [0u8; 8]).unwrap();
    std::fs::write(tmp.path().join("m.onnx"), &text).unwrap();
    let e = load_program(tmp.path().join("m.onnx").to_str().unwrap(), &[]).unwrap_err().to_string();
    assert!(e.contains("are outside the file (8 bytes)"), "{e}");
}

#[test]
fn convolutions_other_than_patch_embeddings_are_refused() {
    for (k, why) in [
        ("stride", "strides [2, 2] differ from the kernel [4, 4]"),
        ("pads", "pads [1, 1, 1, 1]"),
        ("group", "group = 3"),
    ] {
        let path = format!("tests/onnx/conv_{k}.onnx");
        let e = load_program(&path, &[]).unwrap_err().to_string();
        assert!(e.contains(&format!("node 0 `/bad_{k}/Conv` (Conv): {why}")), "{e}");
        assert!(e.contains("general convolution is not supported"), "{e}");
    }
}

/// A small deterministic generator (xorshift) for the fuzz loop.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One random edit: flip bits, overwrite, insert or delete bytes, or truncate.
fn mutate(bytes: &mut Vec<u8>, rng: &mut Rng) {
    let at = rng.below(bytes.len());
    match rng.below(6) {
        0 => bytes[at] ^= 1 << rng.below(8),
        1 => bytes[at] = rng.next() as u8,
        2 => bytes.insert(at, rng.next() as u8),
        3 if bytes.len() > 1 => {
            bytes.remove(at);
        }
        4 => bytes.truncate(at),
        _ => bytes[at] = [0x00, 0x01, 0x7f, 0x80, 0xff][rng.below(5)],
    }
}

#[test]
fn mutated_models_are_errors_or_programs_never_panics() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut loaded = 0;
    for model in MODELS {
        let original = std::fs::read(dir(model).join("model.onnx")).unwrap();
        for _ in 0..1500 {
            let mut bytes = original.clone();
            for _ in 0..1 + rng.below(4) {
                if !bytes.is_empty() {
                    mutate(&mut bytes, &mut rng);
                }
            }
            if let Ok(p) = program_from_onnx("fuzz.onnx", &bytes, &[]) {
                loaded += 1;
                // A program that loads is well typed; one of a testable size also evaluates
                // (a mutated size may legally ask for more memory than a test should take).
                let small = (0..p.len()).all(|i| p.ty(egg::Id::from(i)).is_none_or(|t| t.numel() <= 1 << 16));
                if small {
                    let _ = eval(&p, &eqfuse::random_inputs(&p, 1));
                }
            }
        }
    }
    assert!(loaded > 0, "no mutated model loaded: the loop only exercised the decoder");
}
