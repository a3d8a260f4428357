//! Planning time (saturation and extraction) over the example corpus and over generated residual
//! stacks of 1 to 12 blocks. Targets: every example under 100 ms; a 12-block stack (about 500
//! operators) under 5 s on one core.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use eqfuse::{load_program, optimize, parse_program, residual_stack_eqf, DeviceProfile, OptimizeOptions};

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").expect("built-in profile"))
}

fn examples(c: &mut Criterion) {
    let mut paths: Vec<_> = std::fs::read_dir("examples")
        .expect("examples/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "eqf"))
        .collect();
    paths.sort();
    let mut group = c.benchmark_group("plan-example");
    group.sample_size(10);
    for path in paths {
        let Ok(program) = load_program(path.to_str().unwrap_or_default(), &[]) else { continue };
        let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        group.bench_function(name, |b| b.iter(|| optimize(&program, &opts()).expect("plans")));
    }
    group.finish();
}

fn stacks(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan-residual-stack");
    group.sample_size(10);
    for blocks in [1, 2, 4, 8, 12] {
        let program = parse_program("stack.eqf", &residual_stack_eqf(blocks, 4096, 1024), &[]).expect("parses");
        let plan = optimize(&program, &opts()).expect("plans").plan;
        eprintln!(
            "stack of {blocks}: {} operators, {} e-nodes, {} iterations, stopped: {}, {} kernels",
            program.len(),
            plan.search.enodes,
            plan.search.iterations,
            plan.search.stop_reason,
            plan.total.kernels
        );
        group.bench_with_input(BenchmarkId::from_parameter(blocks), &program, |b, p| {
            b.iter(|| optimize(p, &opts()).expect("plans"))
        });
    }
    group.finish();
}

criterion_group!(benches, examples, stacks);
criterion_main!(benches);
