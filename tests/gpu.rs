//! GPU tests: every shared case and every example (dims capped at 512), fused and unfused,
//! run on the GPU and compared with the CPU reference; reductions must be deterministic.
//!
//! Without a usable GPU the tests say why and pass; with `EQFUSE_REQUIRE_GPU=1` (set by the
//! device script `benches/gpu/run.sh`) a missing GPU fails. With `EQFUSE_PREFILL=1` and no
//! GPU, they instead compile every kernel into the NVRTC disk cache (so a GPU session spends
//! no time compiling).

mod common;

use eqfuse::{
    codegen_plan, nvrtc_compile_cached, optimize, run_on, unfused_plan, DeviceProfile, Error, FusionPlan, Gpu,
    GpuRunOptions, GpuRunReport, OptimizeOptions, Program, Template, DEFAULT_ARCH,
};

/// The GPU, or `None` after saying why there is none (or after prefilling the cache).
fn gpu_or_skip(plans: &[(String, Program, FusionPlan)]) -> Option<Gpu> {
    match Gpu::open() {
        Ok(g) => Some(g),
        Err(e @ Error::NoGpu(_)) if std::env::var("EQFUSE_REQUIRE_GPU").as_deref() != Ok("1") => {
            if std::env::var("EQFUSE_PREFILL").as_deref() == Ok("1") {
                prefill(plans);
            }
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn prefill(plans: &[(String, Program, FusionPlan)]) {
    let mut n = 0;
    for (name, _, plan) in plans {
        for s in codegen_plan(plan).unwrap_or_else(|e| panic!("{name}: {e}")) {
            nvrtc_compile_cached(&s.source, &s.name, DEFAULT_ARCH).unwrap_or_else(|e| panic!("{name}: {e}"));
            n += 1;
        }
    }
    eprintln!("prefilled the NVRTC cache with {n} kernels");
}

fn generated(plan: &FusionPlan) -> bool {
    plan.kernels.iter().all(|k| k.template != Template::Gemm)
}

/// Every case and capped example, fused and unfused, whose kernels codegen supports.
fn plans() -> Vec<(String, Program, FusionPlan)> {
    let profile = DeviceProfile::load("h100").unwrap();
    let opts = OptimizeOptions::new(profile.clone());
    let mut programs: Vec<(String, Program)> =
        common::cases().into_iter().map(|c| (c.name.to_string(), c.program)).collect();
    for path in common::example_paths() {
        let Ok(full) = eqfuse::load_program(&path, &[]) else { continue };
        let capped: Vec<(String, usize)> = full.dims.iter().map(|(n, v)| (n.clone(), (*v).min(512))).collect();
        if let Ok(p) = eqfuse::load_program(&path, &capped) {
            programs.push((path, p));
        }
    }
    let mut out = Vec::new();
    for (name, program) in programs {
        let fused = optimize(&program, &opts).unwrap().plan;
        let unfused = unfused_plan(&program, &profile).unwrap();
        for (which, plan) in [("fused", fused), ("unfused", unfused)] {
            if generated(&plan) {
                out.push((format!("{name} ({which})"), program.clone(), plan));
            } else {
                eprintln!("not run: {name} ({which}) has gemm kernels (issue 6)");
            }
        }
    }
    out
}

/// Runs a plan and asserts that every output matches the reference.
fn run_checked(gpu: &Gpu, name: &str, program: &Program, plan: &FusionPlan, seed: u64) -> GpuRunReport {
    let sources = codegen_plan(plan).unwrap_or_else(|e| panic!("{name}: {e}"));
    let opts = GpuRunOptions { repeat: 0, seed, ..GpuRunOptions::default() };
    let r = run_on(gpu, program, plan, &sources, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(r.ok(), "{name}: {r}");
    r
}

#[test]
fn cases_and_examples_match_the_reference() {
    let plans = plans();
    let Some(gpu) = gpu_or_skip(&plans) else { return };
    let mut failed = Vec::new();
    for (seed, (name, program, plan)) in plans.iter().enumerate() {
        let sources = codegen_plan(plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        let opts = GpuRunOptions { repeat: 0, seed: seed as u64, ..GpuRunOptions::default() };
        match run_on(&gpu, program, plan, &sources, &opts) {
            Ok(r) if r.ok() => eprintln!("ok: {name}: {} kernels", r.compiled),
            Ok(r) => {
                eprintln!("MISMATCH: {name}\n{r}");
                failed.push(name.clone());
            }
            Err(e) => {
                eprintln!("ERROR: {name}: {e}");
                failed.push(name.clone());
            }
        }
    }
    assert!(failed.is_empty(), "failed on {}: {}", gpu.name, failed.join(", "));
    eprintln!("ran {} plans on {}, all match the reference", plans.len(), gpu.name);
}

#[test]
fn reductions_are_deterministic() {
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let cases: Vec<(String, Program, FusionPlan)> = common::cases()
        .into_iter()
        .filter(|c| ["bias_grads", "cross_entropy", "layernorm", "col_mean_rank3"].contains(&c.name))
        .map(|c| {
            let plan = optimize(&c.program, &opts).unwrap().plan;
            (c.name.to_string(), c.program, plan)
        })
        .collect();
    let Some(gpu) = gpu_or_skip(&cases) else { return };
    for (name, program, plan) in &cases {
        let a = run_checked(&gpu, name, program, plan, 3);
        let b = run_checked(&gpu, name, program, plan, 3);
        for ((n, x), (_, y)) in a.values.iter().zip(&b.values) {
            let same = x.data.iter().zip(&y.data).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "{name}: output {n} differs between two runs");
        }
    }
}
