//! GPU differential run (issue 9): random programs from `gen_program` (the generator of
//! `tests/differential.rs`), each planned three ways — the default plan, the `--strict` plan, and
//! the strict unfused plan (the program as eager runs it) — compiled, run on the GPU, and checked:
//!
//! - every plan's GPU outputs against the CPU reference evaluation of the same plan (its kernels
//!   evaluated one by one on the reference, rounding every value to its dtype). The CPU
//!   differential test proves each plan computes its program; this proves the kernels compute
//!   their plan, so together the GPU computes the program. The rule is `tests/differential.rs`'s:
//!   within the dtype tolerance, or, where not, no further from the f64 values than the tolerance
//!   plus four times the reference's own distance plus 8 units of roundoff of the largest
//!   magnitude (the GPU's transcendental functions are not correctly rounded, and a cancellation
//!   amplifies an ulp);
//! - the strict plan's outputs against the strict unfused plan's, bit for bit (`--strict`: no
//!   inexact rule, no contraction into fused multiply-adds, every value rounded to its dtype,
//!   reductions in the unfused order).
//!
//! Programs whose plans hold a kernel codegen refuses as not supported yet are counted by reason
//! and skipped. A failing program is saved as generated (not shrunk: that would rerun the GPU
//! for minutes) under `tests/cases/diff_gpu/` and the run goes on to the next;
//! `every_saved_gpu_case_passes` runs every saved case again.
//!
//! A plain `cargo test` ignores them (run with `-- --include-ignored`); included without a GPU
//! they say why and pass (`EQFUSE_REQUIRE_GPU=1` makes that a failure);
//! with `EQFUSE_PREFILL=1` and no GPU they compile every kernel of the run into the NVRTC disk
//! cache instead, so that a GPU session spends no time compiling (`EQFUSE_PREFILL_SHARD=K/N`
//! does the same for every N-th program from the K-th, GPU or not, so that N processes can
//! share the work). `EQFUSE_GPU_DIFF_CASES`
//! (default 1000) and `EQFUSE_GPU_DIFF_SEED` choose the programs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use eqfuse::{
    codegen_plan, eval_plan_with, eval_with, nvrtc_compile_cached, optimize, parse_program, random_inputs, recipes,
    run_on, tolerance, unfused_plan, DeviceProfile, Error, FusionPlan, Gpu, GpuRunOptions, KernelSource,
    OptimizeOptions, Precision, Program, Tensor, DEFAULT_ARCH,
};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

mod difftools;
use difftools::{rounding_allowance, save_case, worst_error};

const MAX_STEPS: usize = 6;
const DEFAULT_CASES: u64 = 1000;
const DEFAULT_SEED: u64 = 0x0e9f_06a0;
/// Relative to the package root, where `cargo test` runs (and where the device script runs).
const CASE_DIR: &str = "tests/cases/diff_gpu";

/// The device, or what to do without one.
enum Mode {
    Gpu(Gpu),
    /// No GPU (or `EQFUSE_PREFILL_SHARD=K/N`): compile every kernel into the disk cache (of
    /// the programs whose index is K modulo N).
    Prefill(usize, usize),
}

fn mode() -> Option<Mode> {
    if let Some((k, n)) = std::env::var("EQFUSE_PREFILL_SHARD").ok().and_then(|v| {
        let (k, n) = v.split_once('/')?;
        Some((k.parse().ok()?, n.parse().ok()?))
    }) {
        return Some(Mode::Prefill(k, n));
    }
    match Gpu::open() {
        Ok(g) => Some(Mode::Gpu(g)),
        Err(e @ Error::NoGpu(_)) if std::env::var("EQFUSE_REQUIRE_GPU").as_deref() != Ok("1") => {
            if std::env::var("EQFUSE_PREFILL").as_deref() == Ok("1") {
                return Some(Mode::Prefill(0, 1));
            }
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// What the run saw, summed over programs.
#[derive(Default, Debug)]
struct Tally {
    programs: usize,
    /// Programs skipped because codegen refuses a kernel of one of their plans as not supported
    /// yet, by the reason it gives (kernel numbers taken out).
    unsupported: BTreeMap<String, usize>,
    plans: usize,
    kernels: usize,
    /// Outputs outside the dtype tolerance that rounding explains.
    rounding: usize,
    /// Strict plans whose outputs were bit-identical to the strict unfused plan's.
    strict_identical: usize,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.programs += o.programs;
        for (k, v) in &o.unsupported {
            *self.unsupported.entry(k.clone()).or_default() += v;
        }
        self.plans += o.plans;
        self.kernels += o.kernels;
        self.rounding += o.rounding;
        self.strict_identical += o.strict_identical;
    }
}

/// The three plans of a program: (name, plan).
fn plans(p: &Program) -> Result<Vec<(&'static str, FusionPlan)>, String> {
    let profile = DeviceProfile::load("h100").expect("built-in profile");
    let opts = OptimizeOptions::new(profile.clone());
    let strict = OptimizeOptions { strict: true, ..opts.clone() };
    let plan = |o: &OptimizeOptions| optimize(p, o).map(|r| r.plan).map_err(|e| format!("planning: {e}"));
    Ok(vec![
        ("default", plan(&opts)?),
        ("strict", plan(&strict)?),
        ("strict-unfused", unfused_plan(p, &profile, true).map_err(|e| format!("unfused plan: {e}"))?),
    ])
}

/// Checks a GPU output against the plan's reference value (`want`, declared precision) and the
/// program's f64 value (`exact`); `Ok(true)` when only rounding explains the difference.
fn check_output(got: &Tensor, want: &Tensor, exact: &Tensor, allowance: impl Fn() -> f64) -> Result<bool, String> {
    if got.shape != want.shape {
        return Err(format!("shape {:?}, the reference {:?}", got.shape, want.shape));
    }
    let (rtol, atol) = tolerance(want.dtype);
    let c = got.compare(want, rtol, atol);
    if c.ok() {
        return Ok(false);
    }
    if !want.dtype.is_float() {
        return Err(format!("{c}"));
    }
    if let Some(i) = (0..got.data.len()).find(|&i| !got.data[i].is_finite() && want.data[i].is_finite()) {
        return Err(format!("element {i} is {} on the GPU, {} on the reference", got.data[i], want.data[i]));
    }
    let scale = exact.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let ((gpu, at), (reference, _)) = (worst_error(got, exact), worst_error(want, exact));
    if gpu <= atol + rtol * scale + 4.0 * reference + allowance() {
        return Ok(true);
    }
    Err(format!(
        "the GPU is up to {gpu:.3e} from the f64 values (at element {at}: GPU {}, reference {}, f64 {}), the \
         reference up to {reference:.3e} ({} tolerance {rtol}, {atol}; {c})",
        got.data[at], want.data[at], exact.data[at], want.dtype
    ))
}

/// Whether two runs' outputs are the same bits (every value came from a dtype no wider than
/// f32, so equal f64 values are equal bits; NaN matches NaN).
fn identical(a: &Tensor, b: &Tensor) -> Option<usize> {
    a.data.iter().zip(&b.data).position(|(x, y)| !(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())))
}

/// Plans, compiles, runs and checks one program.
fn check_program(mode: &Mode, index: usize, text: &str, input_seed: u64) -> Result<Tally, String> {
    if let Mode::Prefill(k, n) = mode {
        if index % n != *k {
            return Ok(Tally::default());
        }
    }
    let p = parse_program("generated.eqf", text, &[]).map_err(|e| format!("generator: the parser refused it: {e}"))?;
    let plans = plans(&p)?;
    let mut tally = Tally { programs: 1, ..Tally::default() };
    let mut sources: Vec<Vec<KernelSource>> = vec![];
    for (name, plan) in &plans {
        match codegen_plan(plan) {
            Ok(s) => sources.push(s),
            // A known gap of codegen (say, reductions of i32 values, which accumulate in f32 on
            // the GPU): counted by reason, and the program skipped.
            Err(e) if e.to_string().contains("not supported yet") => {
                let e = e.to_string();
                let reason = e.split_once("): ").map_or(e.as_str(), |(_, r)| r).to_string();
                tally.unsupported.insert(format!("{name} plan: {reason}"), 1);
                return Ok(tally);
            }
            Err(e) => return Err(format!("{name} plan: codegen: {e}")),
        }
    }
    let gpu = match mode {
        Mode::Prefill(..) => {
            for s in sources.iter().flatten() {
                nvrtc_compile_cached(&s.source, &s.name, DEFAULT_ARCH).map_err(|e| format!("{}: {e}", s.name))?;
            }
            return Ok(tally);
        }
        Mode::Gpu(g) => g,
    };
    let inputs = random_inputs(&p, input_seed);
    let exact = eval_with(&p, &inputs, Precision::F64).map_err(|e| format!("reference in f64: {e}"))?;
    let opts = GpuRunOptions { seed: input_seed, repeat: 0, check: false, ..GpuRunOptions::default() };
    let mut values: Vec<Vec<Tensor>> = vec![];
    for ((name, plan), src) in plans.iter().zip(&sources) {
        let report = run_on(gpu, &p, plan, src, &opts).map_err(|e| format!("{name} plan: GPU run: {e}"))?;
        let want = eval_plan_with(plan, &inputs, Precision::Declared).map_err(|e| format!("{name} plan: {e}"))?;
        for (k, ((out, got), w)) in report.values.iter().zip(&want).enumerate() {
            match check_output(got, w, &exact[k], || rounding_allowance(plan, &inputs)) {
                Ok(rounding) => tally.rounding += rounding as usize,
                Err(e) => return Err(format!("{name} plan, output `{out}` on the GPU: {e}")),
            }
        }
        tally.plans += 1;
        tally.kernels += src.len();
        values.push(report.values.into_iter().map(|(_, t)| t).collect());
    }
    for (k, o) in p.outputs.iter().enumerate() {
        if let Some(i) = identical(&values[1][k], &values[2][k]) {
            return Err(format!(
                "strict plan, output `{}`: not bit-identical to the strict unfused plan at element {i} ({} against {})",
                o.name, values[1][k].data[i], values[2][k].data[i]
            ));
        }
    }
    tally.strict_identical = 1;
    Ok(tally)
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn report(what: &str, t: &Tally, secs: f64, failures: usize) {
    let skipped: usize = t.unsupported.values().sum();
    println!(
        "{what}: {} programs ({skipped} skipped: codegen does not support a kernel yet), {} plans ({} kernels) run \
         on the GPU in {secs:.1} s: {failures} failures; {} outputs outside the dtype tolerance, explained by \
         rounding; strict plan bit-identical to the strict unfused plan for {} of {} programs",
        t.programs,
        t.plans,
        t.kernels,
        t.rounding,
        t.strict_identical,
        t.programs - skipped
    );
    for (reason, n) in &t.unsupported {
        println!("  skipped {n}: {reason}");
    }
}

/// Every random program is checked, failing or not: a failure is saved as a case file (the
/// program as generated, not shrunk: shrinking would rerun the GPU for minutes) and the run
/// goes on, so that one session counts every failure among its programs.
#[test]
#[ignore = "needs an NVIDIA GPU: run with `-- --include-ignored` there (benches/gpu/difftest.sh)"]
fn random_programs_run_on_the_gpu_as_their_plans_say() {
    let Some(mode) = mode() else { return };
    let cases = env_or("EQFUSE_GPU_DIFF_CASES", DEFAULT_CASES) as u32;
    let seed = env_or("EQFUSE_GPU_DIFF_SEED", DEFAULT_SEED);
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let strategy = recipes(MAX_STEPS);
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    let start = Instant::now();
    for index in 1..=cases as usize {
        let r = strategy.new_tree(&mut runner).expect("the generator draws a program").current();
        // A panic (a bug, never an answer) is a failure like any other, saved and counted.
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_program(&mode, index, &r.render(), r.input_seed)
        }))
        .unwrap_or_else(|e| {
            let what = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(format!("panicked: {}", what.unwrap_or_default()))
        });
        match checked {
            Ok(t) => tally.add(&t),
            Err(why) => {
                let origin = format!("tests/gpu_differential.rs, seed {seed}, program {index}");
                let saved = save_case(Path::new(CASE_DIR), &r, &why, "GPU differential case", &origin);
                println!("program {index} FAILED: {why} (saved as {})", saved.display());
                failures.push(format!("program {index}: {why} (saved as {})", saved.display()));
            }
        }
    }
    let what = if matches!(mode, Mode::Prefill(..)) { "prefilled (no GPU)" } else { "random programs" };
    report(what, &tally, start.elapsed().as_secs_f64(), failures.len());
    assert!(failures.is_empty(), "{} random programs failed on the GPU:\n{}", failures.len(), failures.join("\n"));
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with `-- --include-ignored` there (benches/gpu/difftest.sh)"]
fn every_saved_gpu_case_passes() {
    let Some(mode) = mode() else { return };
    let dir = Path::new(CASE_DIR).to_path_buf();
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|d| d.map(|e| e.expect("entry").path()).collect()).unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "eqf"));
    files.sort();
    let (start, mut total, mut failed) = (Instant::now(), Tally::default(), vec![]);
    for f in &files {
        let text = std::fs::read_to_string(f).expect("case file");
        let seed = text
            .lines()
            .filter_map(|l| l.strip_prefix("# input-seed:"))
            .find_map(|v| v.trim().parse().ok())
            .unwrap_or(0);
        match check_program(&mode, 0, &text, seed) {
            Ok(t) => total.add(&t),
            Err(e) => failed.push(format!("{}: {e}", f.display())),
        }
    }
    report("saved GPU cases", &total, start.elapsed().as_secs_f64(), failed.len());
    assert!(failed.is_empty(), "saved GPU cases fail:\n{}", failed.join("\n"));
}
