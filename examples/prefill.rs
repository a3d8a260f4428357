//! Compiles every kernel of programs' fused and unfused plans (as the profile `--device` names
//! plans them, default the built-in h100, strict or not) into the NVRTC disk cache
//! (`EQFUSE_CACHE_DIR`), without a GPU, so that a GPU session spends its time running: `cargo run
//! --release --example prefill -- [--strict] [--device PROFILE] PROG...` (`.eqf` files or `.json`
//! graphs at their declared sizes).
fn main() {
    let mut strict = false;
    let mut device = "h100".to_string();
    let mut files = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--strict" => strict = true,
            "--device" => device = it.next().unwrap_or_default(),
            _ => files.push(a),
        }
    }
    if files.is_empty() || device.is_empty() {
        eprintln!("usage: prefill [--strict] [--device PROFILE] PROG...");
        std::process::exit(2);
    }
    if let Err(e) = prefill(&files, strict, &device) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn prefill(files: &[String], strict: bool, device: &str) -> eqfuse::Result<()> {
    let profile = eqfuse::DeviceProfile::load(device)?;
    let opts = eqfuse::OptimizeOptions { strict, ..eqfuse::OptimizeOptions::new(profile.clone()) };
    let mut n = 0;
    for file in files {
        let program = eqfuse::load_program(file, &[])?;
        let fused = eqfuse::optimize(&program, &opts)?.plan;
        let unfused = eqfuse::unfused_plan(&program, &profile, strict)?;
        for plan in [fused, unfused] {
            for s in eqfuse::codegen_plan(&plan)? {
                if s.cublaslt.is_none() {
                    eqfuse::nvrtc_compile_cached(&s.source, &s.name, eqfuse::DEFAULT_ARCH)?;
                    n += 1;
                }
            }
        }
        println!("prefilled {file}");
    }
    println!("{n} kernels in {}", eqfuse::cache_dir().display());
    Ok(())
}
