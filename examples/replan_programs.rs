//! Plans programs `gen_programs` kept again with the cost model as it is now, so that a change to
//! the model can be judged on kernels already measured (issue 22): `cargo run --release --example
//! replan_programs -- IN_DIR OUT_DIR [--device h100] [--unfused-only]`.
//!
//! For every `IN_DIR/gSEED.eqf`, writes `OUT_DIR/gSEED.unfused.json` (the unfused plan `eqfuse
//! bench` times: one kernel per primitive operator, the same kernels whatever the model, so each
//! is the measured one re-priced) and, unless `--unfused-only`, `OUT_DIR/gSEED.plan.json` (the
//! fused plan, which may itself change with the model). `benches/fidelity.py RESULTS --repredict OUT_DIR`
//! joins them to bench JSONs by program, kernel id, kernel name and bytes.
use std::path::PathBuf;

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut dirs, mut device, mut unfused_only) = (vec![], "h100".to_string(), false);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--device" => device = args.next().unwrap_or_else(|| usage()),
            "--unfused-only" => unfused_only = true,
            _ => dirs.push(PathBuf::from(a)),
        }
    }
    let [input, out] = <[PathBuf; 2]>::try_from(dirs).unwrap_or_else(|_| usage());
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    let profile = eqfuse::DeviceProfile::load(&device).unwrap_or_else(|e| panic!("--device {device}: {e}"));
    let opts = eqfuse::OptimizeOptions::new(profile.clone());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&input)
        .unwrap_or_else(|e| panic!("{}: {e}", input.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "eqf"))
        .collect();
    files.sort();
    for path in files {
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("program").to_string();
        let program = match eqfuse::load_program(&path.to_string_lossy(), &[]) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{stem}: {e}");
                continue;
            }
        };
        let mut plans = vec![("unfused", eqfuse::unfused_plan(&program, &profile, false))];
        if !unfused_only {
            plans.push(("plan", eqfuse::optimize(&program, &opts).map(|o| o.plan)));
        }
        for (which, plan) in plans {
            match plan {
                Ok(plan) => {
                    let text = serde_json::to_string_pretty(&eqfuse::plan_json(&plan)).expect("json") + "\n";
                    let file = out.join(format!("{stem}.{which}.json"));
                    std::fs::write(&file, text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                }
                Err(e) => eprintln!("{stem} {which}: {e}"),
            }
        }
        eprintln!("{stem}");
    }
}

fn usage() -> ! {
    eprintln!("usage: replan_programs IN_DIR OUT_DIR [--device PROFILE] [--unfused-only]");
    std::process::exit(2);
}
