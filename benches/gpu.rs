//! GPU measurements of the example programs at large sizes: calibration, then each program's
//! fused plan (checked against the CPU reference) and eager unfused plan, measured against
//! predicted. Writes `gpu-bench.json`, `gpu-bench.md` and the calibrated profile to the folder
//! given by `--out` (default `target/gpu-bench`). Prints that it was skipped, and exits 0, on a
//! machine without a usable GPU.
//!
//! `cargo bench --bench gpu -- [--out DIR] [--only NAME,...] [--repeat N] [--prefill] [--persistent]`
//! (`--prefill`: compile every kernel into the NVRTC disk cache, no GPU needed).

use std::fmt::Write as _;
use std::path::PathBuf;

use eqfuse::{
    calibrate_on, codegen_plan, load_program, optimize, profile_name_of, run_on, unfused_plan, DeviceProfile, Error,
    Gpu, GpuRunOptions, GpuRunReport, OptimizeOptions,
};
use serde_json::json;

/// A measured program: name, example file, dim overrides, whether to check it against the
/// CPU reference (the two 2^28-element programs are checked at small sizes by the GPU tests).
type Bench = (&'static str, &'static str, &'static [(&'static str, usize)], bool);

const PROGRAMS: &[Bench] = &[
    ("add_mul", "examples/add_mul.eqf", &[], false),
    ("softplus", "examples/softplus.eqf", &[], false),
    ("bias_gelu_dropout", "examples/bias_gelu_dropout.eqf", &[], true),
    ("layernorm", "examples/layernorm.eqf", &[("R", 16384), ("C", 4096)], true),
    ("layernorm_4096x1024", "examples/layernorm.eqf", &[], true),
    ("rmsnorm_bf16", "examples/rmsnorm.eqf", &[], true),
    ("softmax", "examples/softmax.eqf", &[], true),
    ("softmax_small", "examples/softmax_small.eqf", &[], true),
    ("cross_entropy", "examples/cross_entropy.eqf", &[], true),
    ("cross_entropy_grad", "examples/cross_entropy_grad.eqf", &[], true),
    ("layernorm_grad", "examples/layernorm_grad.eqf", &[], true),
];

struct Args {
    out: PathBuf,
    only: Option<Vec<String>>,
    repeat: usize,
    prefill: bool,
    persistent: bool,
}

fn args() -> Args {
    let mut a =
        Args { out: PathBuf::from("target/gpu-bench"), only: None, repeat: 30, prefill: false, persistent: false };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--out" => a.out = it.next().map(PathBuf::from).unwrap_or(a.out),
            "--only" => a.only = it.next().map(|s| s.split(',').map(str::to_string).collect()),
            "--repeat" => a.repeat = it.next().and_then(|s| s.parse().ok()).unwrap_or(a.repeat),
            "--prefill" => a.prefill = true,
            "--persistent" => a.persistent = true,
            _ => {}
        }
    }
    a
}

fn main() {
    let a = args();
    if a.prefill {
        if let Err(e) = prefill() {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        return;
    }
    let gpu = match Gpu::open() {
        Ok(g) => g,
        Err(Error::NoGpu(why)) => {
            println!("gpu bench skipped: no usable GPU ({why})");
            return;
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = run(&gpu, &a) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(gpu: &Gpu, a: &Args) -> eqfuse::Result<()> {
    std::fs::create_dir_all(&a.out).map_err(|e| Error::io(a.out.display().to_string(), e))?;
    println!("device: {} ({}, {} SMs, L2 {} MB)", gpu.name, gpu.arch, gpu.sms, gpu.l2_bytes >> 20);
    let base = DeviceProfile::load(&profile_name_of(&gpu.name)).or_else(|_| DeviceProfile::load("h100"))?;
    let cal = calibrate_on(gpu, &base)?;
    print!("{cal}");
    let profile_path = a.out.join(format!("profile-{}.json", cal.profile.name));
    let text = serde_json::to_string_pretty(&cal.profile).unwrap_or_default() + "\n";
    std::fs::write(&profile_path, text).map_err(|e| Error::io(profile_path.display().to_string(), e))?;
    let profile = cal.profile.clone();
    let mut rows = Vec::new();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "device: {} ({}); copy bandwidth {:.0} GB/s; launch {:.2} us\n",
        gpu.name, gpu.arch, profile.copy_bandwidth_gbs, profile.launch_overhead_us
    );
    let _ = writeln!(
        md,
        "| program | fused kernels | fused us (pred) | unfused us (pred) | speedup measured | speedup predicted | \
         fused us, graph | unfused us, graph | speedup, graphs | device memory (one buffer per tensor) | unfused memory (one per tensor) | check |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut kernels_md = String::from(
        "\n| program | kernel | bytes | predicted us | measured us | GB/s | of copy |\n|---|---|---|---|---|---|---|\n",
    );
    for &(name, file, dims, check) in PROGRAMS {
        if a.only.as_ref().is_some_and(|o| !o.iter().any(|x| x == name)) {
            continue;
        }
        let overrides: Vec<(String, usize)> = dims.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        let program = load_program(file, &overrides)?;
        let fused = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
        let unfused = unfused_plan(&program, &profile, false)?;
        let opts = GpuRunOptions {
            repeat: a.repeat,
            check,
            profile: Some(profile.clone()),
            persistent: a.persistent,
            graph: true,
            ..GpuRunOptions::default()
        };
        let f = run_on(gpu, &program, &fused, &codegen_plan(&fused)?, &opts)?;
        print!("{f}");
        let u =
            run_on(gpu, &program, &unfused, &codegen_plan(&unfused)?, &GpuRunOptions { check: false, ..opts.clone() })?;
        println!(
            "  unfused: {} kernels, {:.1} us measured, {:.1} us predicted",
            u.kernels.len(),
            u.total_measured_us,
            u.total_predicted_us
        );
        let speed_m = u.total_measured_us / f.total_measured_us;
        let speed_p = u.total_predicted_us / f.total_predicted_us;
        let verdict = if !check {
            "not checked".to_string()
        } else if f.ok() {
            "ok".to_string()
        } else {
            "MISMATCH".to_string()
        };
        let (fg, ug) = (f.graph_measured_us.unwrap_or(f64::NAN), u.graph_measured_us.unwrap_or(f64::NAN));
        let mem = |r: &GpuRunReport| {
            format!("{} ({})", eqfuse::human_bytes(r.device_bytes), eqfuse::human_bytes(r.unshared_device_bytes))
        };
        let _ = writeln!(
            md,
            "| {name} | {} | {:.1} ({:.1}) | {:.1} ({:.1}) | {speed_m:.2}x | {speed_p:.2}x | {fg:.1} | {ug:.1} | {:.2}x | {} | {} | {verdict} |",
            f.kernels.len(),
            f.total_measured_us,
            f.total_predicted_us,
            u.total_measured_us,
            u.total_predicted_us,
            ug / fg,
            mem(&f),
            mem(&u)
        );
        for k in &f.kernels {
            let _ = writeln!(
                kernels_md,
                "| {name} | {} | {} | {:.1} | {:.1} | {:.0} | {:.0}% |",
                k.name,
                k.bytes,
                k.predicted_us,
                k.measured_us,
                k.achieved_gbs,
                100.0 * k.achieved_gbs / profile.copy_bandwidth_gbs
            );
        }
        rows.push(json!({
            "program": name, "file": file, "dims": dims.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>(),
            "fused": report_json(&f, profile.copy_bandwidth_gbs), "unfused": report_json(&u, profile.copy_bandwidth_gbs),
            "speedup_measured": speed_m, "speedup_predicted": speed_p,
        }));
    }
    md.push_str(&kernels_md);
    let doc = json!({
        "schema": "eqfuse.gpu-bench/1", "device": gpu.name, "arch": gpu.arch,
        "calibration": { "copy_bandwidth_gbs": profile.copy_bandwidth_gbs, "launch_overhead_us": profile.launch_overhead_us,
            "templates": cal.templates.iter().map(|(t, p, b, us, s)| json!({"template": t.name(), "program": p, "bytes": b, "us": us, "share": s})).collect::<Vec<_>>() },
        "programs": rows,
    });
    let write = |file: &str, text: String| {
        let p = a.out.join(file);
        std::fs::write(&p, text).map_err(|e| Error::io(p.display().to_string(), e))
    };
    write("gpu-bench.json", serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n")?;
    write("gpu-bench.md", md.clone())?;
    println!("\n{md}");
    Ok(())
}

/// Compiles the kernels of every program's plans (as the built-in h100 profile plans them)
/// into the NVRTC disk cache.
fn prefill() -> eqfuse::Result<()> {
    let profile = DeviceProfile::load("h100")?;
    let mut n = 0;
    for &(name, file, dims, _) in PROGRAMS {
        let overrides: Vec<(String, usize)> = dims.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        let program = load_program(file, &overrides)?;
        let fused = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
        let unfused = unfused_plan(&program, &profile, false)?;
        for plan in [fused, unfused] {
            for s in codegen_plan(&plan)? {
                eqfuse::nvrtc_compile_cached(&s.source, &s.name, eqfuse::DEFAULT_ARCH)?;
                n += 1;
            }
        }
        println!("prefilled {name}");
    }
    println!("{n} kernels in {}", eqfuse::cache_dir().display());
    Ok(())
}

fn report_json(r: &GpuRunReport, copy_gbs: f64) -> serde_json::Value {
    json!({
        "measured_us": r.total_measured_us, "predicted_us": r.total_predicted_us, "ok": r.ok(),
        "graph_measured_us": r.graph_measured_us, "device_bytes": r.device_bytes,
        "unshared_device_bytes": r.unshared_device_bytes,
        "kernels": r.kernels.iter().map(|k| json!({
            "name": k.name, "bytes": k.bytes, "predicted_us": k.predicted_us, "measured_us": k.measured_us,
            "achieved_gbs": k.achieved_gbs, "copy_share": k.achieved_gbs / copy_gbs })).collect::<Vec<_>>(),
        "outputs": r.outputs.iter().map(|o| json!({
            "name": o.name, "type": o.ty.to_string(), "unwritten": o.unwritten, "mismatches": o.mismatches,
            "max_abs_error": o.max_abs_error, "max_abs_ref": o.max_abs_ref, "scaled_error": o.scaled_error,
            "tolerance": o.tolerance })).collect::<Vec<_>>(),
    })
}
