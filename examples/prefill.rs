//! Compiles every kernel of programs' fused and unfused plans (as the built-in h100 profile
//! plans them, strict or not) into the NVRTC disk cache (`EQFUSE_CACHE_DIR`), without a GPU, so
//! that a GPU session spends its time running: `cargo run --release --example prefill --
//! [--strict] PROG...` (`.eqf` files or `.json` graphs at their declared sizes).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let strict = args.iter().any(|a| a == "--strict");
    let files: Vec<&String> = args.iter().filter(|a| *a != "--strict").collect();
    if files.is_empty() {
        eprintln!("usage: prefill [--strict] PROG...");
        std::process::exit(2);
    }
    if let Err(e) = prefill(&files, strict) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn prefill(files: &[&String], strict: bool) -> eqfuse::Result<()> {
    let profile = eqfuse::DeviceProfile::load("h100")?;
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
