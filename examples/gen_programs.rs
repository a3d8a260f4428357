//! Writes random programs at the sizes models run at, for measuring the cost model on programs
//! nobody tuned it for (benches/gpu/fidelity.sh runs `eqfuse bench` on them, benches/fidelity.py
//! analyses the results): `cargo run --release --example gen_programs -- --count 250 --seed 1
//! -o DIR [--steps 8] [--min-us 50] [--max-work 3e8] [--device h100]`.
//!
//! Each seed's recipe (`random_recipe(seed, steps)`) is rendered at `Scale::LARGE`, planned with
//! the options `eqfuse bench` plans with (for the `--device` profile, as `eqfuse bench
//! --device` must name on the GPU), and kept if its fused plan is
//! predicted to take at least `--min-us` microseconds and the CPU reference's work on it (the
//! elements of every value it computes, 16-bit ones weighted, plus the multiply-adds of products and attention) is at
//! most `--max-work` (`eqfuse bench` checks every fused plan against that reference; a count,
//! not a time measured here, so that the programs kept do not depend on this machine's load).
//! Every kept program is also evaluated on its seeded inputs, which must give finite values. A kept program is `DIR/gSEED.eqf`, with its fused plan `DIR/gSEED.plan.json`
//! and the unfused plan `eqfuse bench` times beside it, `DIR/gSEED.unfused.json` (the plan JSON
//! of docs/plan-schema.md; benches/fidelity.py reads features of each kernel from them).
//! `DIR/index.json` lists every seed tried: what became of it and the times measured here.
//! A program that fails to parse, that the optimizer rejects or panics on, or whose reference
//! values are not finite, is a bug: it is saved under `DIR/failed/` with the error, and the exit
//! status is 1. One whose plans code generation refuses ("not supported yet") is saved under
//! `DIR/unsupported/` and skipped.
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Value};

struct Args {
    count: usize,
    seed: u64,
    steps: usize,
    min_us: f64,
    max_work: f64,
    device: String,
    out: PathBuf,
}

fn usage() -> ! {
    eprintln!(
        "usage: gen_programs --count N --seed S -o DIR [--steps K] [--min-us US] [--max-ref-s SECS] [--device PROFILE]"
    );
    std::process::exit(2);
}

fn num<T: std::str::FromStr>(v: &str) -> T {
    v.parse().unwrap_or_else(|_| usage())
}

fn args() -> Args {
    let mut a =
        Args { count: 0, seed: 1, steps: 8, min_us: 50.0, max_work: 3e8, device: "h100".into(), out: PathBuf::new() };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--count" => a.count = num(&value),
            "--seed" => a.seed = num(&value),
            "--steps" => a.steps = num(&value),
            "--min-us" => a.min_us = num(&value),
            "--max-work" => a.max_work = num(&value),
            "--device" => a.device = value,
            "-o" | "--out" => a.out = PathBuf::from(value),
            _ => usage(),
        }
    }
    if a.count == 0 || a.out.as_os_str().is_empty() || a.steps == 0 {
        usage();
    }
    a
}

/// What became of one seed.
enum Outcome {
    Kept(Value),
    Skipped(String),
    Failed(String),
}

fn main() {
    let a = args();
    std::fs::create_dir_all(&a.out).unwrap_or_else(|e| panic!("{}: {e}", a.out.display()));
    let profile = eqfuse::DeviceProfile::load(&a.device).unwrap_or_else(|e| panic!("--device {}: {e}", a.device));
    // As `eqfuse bench` plans (`OptimizeOptions::new`), so that the device makes these plans.
    let opts = eqfuse::OptimizeOptions::new(profile.clone());
    let (mut kept, mut failed, mut index) = (0, 0, vec![]);
    let mut seed = a.seed;
    let t0 = Instant::now();
    while kept < a.count {
        let name = format!("g{seed}");
        let text = eqfuse::random_recipe(seed, a.steps).render_at(eqfuse::Scale::LARGE);
        let text = format!("# gen_programs: seed {seed}, {} steps, Scale::LARGE\n{text}", a.steps);
        let outcome = std::panic::catch_unwind(|| consider(&a, &name, &text, &opts, &profile))
            .unwrap_or_else(|p| Outcome::Failed(format!("panic: {}", panic_text(&p))));
        let entry = match outcome {
            Outcome::Kept(v) => {
                kept += 1;
                json!({"seed": seed, "program": format!("{name}.eqf"), "kept": true, "stats": v})
            }
            Outcome::Skipped(why) => json!({"seed": seed, "kept": false, "why": why}),
            Outcome::Failed(why) => {
                failed += 1;
                let dir = a.out.join("failed");
                std::fs::create_dir_all(&dir).expect("the failed folder");
                std::fs::write(dir.join(format!("{name}.eqf")), format!("{text}# error: {why}\n")).expect("write");
                eprintln!("FAILED {name}: {why}");
                json!({"seed": seed, "kept": false, "failed": why})
            }
        };
        eprintln!("[{:.0} s] {kept}/{}: {entry}", t0.elapsed().as_secs_f64(), a.count);
        index.push(entry);
        seed += 1;
    }
    let summary = json!({"schema": "eqfuse.gen_programs/1", "steps": a.steps, "min_us": a.min_us,
        "max_work": a.max_work, "device": a.device, "first_seed": a.seed, "kept": kept, "tried": index.len(), "failed": failed,
        "seconds": t0.elapsed().as_secs_f64(), "seeds": index});
    write(&a.out.join("index.json"), &(serde_json::to_string_pretty(&summary).expect("json") + "\n"));
    println!(
        "{kept} programs of {} seeds in {}, {failed} failed ({:.0} s)",
        index.len(),
        a.out.display(),
        t0.elapsed().as_secs_f64()
    );
    if failed > 0 {
        std::process::exit(1);
    }
}

fn consider(
    a: &Args,
    name: &str,
    text: &str,
    opts: &eqfuse::OptimizeOptions,
    profile: &eqfuse::DeviceProfile,
) -> Outcome {
    let file = format!("{name}.eqf");
    let program = match eqfuse::parse_program(&file, text, &[]) {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(format!("parse: {e}")),
    };
    if let Err(e) = eqfuse::check_fits(&program) {
        return Outcome::Skipped(format!("too large for the reference: {e}"));
    }
    let t = Instant::now();
    let fused = match eqfuse::optimize(&program, opts) {
        Ok(o) => o.plan,
        Err(e) => return Outcome::Failed(format!("optimize: {e}")),
    };
    let optimize_ms = t.elapsed().as_secs_f64() * 1e3;
    if fused.kernels.is_empty() {
        return Outcome::Skipped("the plan runs no kernel".into());
    }
    if fused.total.predicted_us < a.min_us {
        return Outcome::Skipped(format!("predicted {:.1} us", fused.total.predicted_us));
    }
    let unfused = match eqfuse::unfused_plan(&program, profile, false) {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(format!("unfused plan: {e}")),
    };
    // Code generation refuses what it does not run yet (an i32 column reduction): such a
    // program cannot be benched; it is kept under `unsupported/` and counted, not failed.
    if let Err(e) = eqfuse::codegen_plan(&fused).and_then(|_| eqfuse::codegen_plan(&unfused)) {
        let dir = a.out.join("unsupported");
        std::fs::create_dir_all(&dir).expect("the unsupported folder");
        write(&dir.join(&file), &format!("{text}# codegen: {e}\n"));
        return Outcome::Skipped(format!("codegen: {e}"));
    }
    let work = reference_work(&program);
    if work > a.max_work {
        return Outcome::Skipped(format!("reference work {work:.3e}"));
    }
    let t = Instant::now();
    let inputs = eqfuse::random_inputs(&program, 0);
    let inputs_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let values = match eqfuse::eval(&program, &inputs) {
        Ok(v) => v,
        Err(e) => return Outcome::Failed(format!("reference: {e}")),
    };
    let reference_ms = t.elapsed().as_secs_f64() * 1e3;
    if let Some(bad) = values.iter().position(|v| v.data.iter().any(|x| !x.is_finite())) {
        return Outcome::Failed(format!("output {bad} is not finite on the seeded inputs"));
    }
    write(&a.out.join(&file), text);
    write(&a.out.join(format!("{name}.plan.json")), &plan_text(&fused));
    write(&a.out.join(format!("{name}.unfused.json")), &plan_text(&unfused));
    let largest = unfused.kernels.iter().flat_map(|k| k.reads.iter().chain(&k.writes)).map(|t| t.ty.numel()).max();
    Outcome::Kept(
        json!({"optimize_ms": optimize_ms, "inputs_ms": inputs_ms, "reference_ms": reference_ms, "reference_work": work,
           "fused_us": fused.total.predicted_us, "unfused_us": unfused.total.predicted_us,
           "fused_kernels": fused.kernels.len(), "unfused_kernels": unfused.kernels.len(),
           "largest_tensor": largest}),
    )
}

/// What an f16 or bf16 element costs the reference, in f32 elements (fitted to reference times
/// of the first 45 kept seeds on a 2-core machine, 2026-11-26).
const SIXTEEN_BIT: f64 = 8.0;

/// The CPU reference's work on a program: the elements of every live value (16-bit ones
/// weighted by `SIXTEEN_BIT`), plus the
/// multiply-adds of each matrix product (`[.., m, k] @ [.., k, n]`: output elements times k) and
/// attention (scores and weighted sum: query rows times keys times (d + dv)).
fn reference_work(program: &eqfuse::Program) -> f64 {
    use egg::Language;
    let mut work = 0.0;
    for (i, live) in program.live().into_iter().enumerate() {
        let id = egg::Id::from(i);
        let (Some(ty), true) = (program.ty(id), live) else { continue };
        let out = ty.numel() as f64;
        // The reference rounds each 16-bit value in software: several times an f32's cost.
        let weight = if matches!(ty.dtype, eqfuse::DType::F16 | eqfuse::DType::Bf16) { SIXTEEN_BIT } else { 1.0 };
        work += out * weight;
        let node = program.node(id);
        let Some(op) = node.opcode() else { continue };
        let arg = |k: usize| program.ty(node.children()[k]).map(|t| t.shape.clone()).unwrap_or_default();
        let last = |s: &[usize]| s.last().copied().unwrap_or(1) as f64;
        if op.name() == "@" {
            work += out * last(&arg(0));
        } else if op.name().starts_with("attention") && node.children().len() >= 3 {
            let (q, k) = (arg(0), arg(1));
            let keys = k.len().checked_sub(2).map_or(1.0, |i| k[i] as f64);
            work += out / last(&ty.shape) * keys * (last(&q) + last(&ty.shape));
        }
    }
    work
}

fn plan_text(plan: &eqfuse::FusionPlan) -> String {
    serde_json::to_string_pretty(&eqfuse::plan_json(plan)).expect("json") + "\n"
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}
