//! Planning time (saturation and extraction) over the example corpus, over generated residual
//! stacks of 1 to 12 blocks, and over generated transformer stacks of 1 to 12 blocks, forward and
//! forward+backward (issue 7), over long chains with skip connections,
//! `t_i = f(t_(i-1)) * y + t_(i-7)` (issues 18 and 21: extraction near-linear in program size),
//! and over a GPT-2-like training step of 12 blocks (issue 21: planning at model scale).
//! Each size prints its e-graph size, iterations, stop reason, kernel count and planning time
//! once, and whether the time limit cut anything. Targets: every example under 100 ms; a
//! transformer block forward+backward under 1 s; 12 of them under 30 s; a chain of 2,000
//! bindings under 10 s with default options, one of 20,000 within `--time-limit 5`; issue 21:
//! a chain of 20,000 operators (6,667 bindings) and one of 20,000 bindings (60,000 operators)
//! each under 10 s, and the 12-block GPT-2 training step under 10 s, with the library's default
//! options and without the time limit cutting anything.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use eqfuse::{
    gpt2_train_eqf, load_program, optimize, parse_program, residual_stack_eqf, skip_chain_eqf, transformer_stack_eqf,
    DeviceProfile, OptimizeOptions, Program,
};

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

/// Plans `program` once and prints its size and search report (the scaling table's columns).
fn describe(what: &str, program: &Program) {
    let start = std::time::Instant::now();
    let plan = optimize(program, &opts()).expect("plans").plan;
    eprintln!(
        "{what}: {} operators, {} e-nodes, {} e-classes, {} iterations, stopped: {}, {} kernels, planned in {:.3} s{}",
        program.len(),
        plan.search.enodes,
        plan.search.eclasses,
        plan.search.iterations,
        plan.search.stop_reason,
        plan.total.kernels,
        start.elapsed().as_secs_f64(),
        if plan.search.time_limit_cut.is_empty() {
            String::new()
        } else {
            format!(" (time limit cut {})", plan.search.time_limit_cut.join(", "))
        }
    );
}

fn skip_chains(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan-skip-chain");
    group.sample_size(10);
    for (bindings, functions) in [
        (100, &["exp"][..]),
        (500, &["exp", "tanh", "sigmoid"][..]),
        (2000, &[][..]),
        // 20,000 operators, and 20,000 bindings.
        (6667, &[][..]),
        (20_000, &[][..]),
    ] {
        let text = skip_chain_eqf(bindings, 4096, 1024, functions);
        let program = parse_program("chain.eqf", &text, &[]).expect("parses");
        describe(&format!("skip chain of {bindings}"), &program);
        group.bench_with_input(BenchmarkId::from_parameter(bindings), &program, |b, p| {
            b.iter(|| optimize(p, &opts()).expect("plans"))
        });
    }
    group.finish();
}

fn stacks(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan-residual-stack");
    group.sample_size(10);
    for blocks in [1, 2, 4, 8, 12] {
        let program = parse_program("stack.eqf", &residual_stack_eqf(blocks, 4096, 1024), &[]).expect("parses");
        describe(&format!("residual stack of {blocks}"), &program);
        group.bench_with_input(BenchmarkId::from_parameter(blocks), &program, |b, p| {
            b.iter(|| optimize(p, &opts()).expect("plans"))
        });
    }
    group.finish();
}

fn transformer_stacks(c: &mut Criterion) {
    for backward in [false, true] {
        let name = if backward { "plan-transformer-fwd-bwd" } else { "plan-transformer-fwd" };
        let mut group = c.benchmark_group(name);
        group.sample_size(10);
        for blocks in [1, 2, 4, 8, 12] {
            let text = transformer_stack_eqf(blocks, 2, 512, backward);
            let program = parse_program("transformer.eqf", &text, &[]).expect("parses");
            describe(&format!("{name} of {blocks}"), &program);
            group.bench_with_input(BenchmarkId::from_parameter(blocks), &program, |b, p| {
                b.iter(|| optimize(p, &opts()).expect("plans"))
            });
        }
        group.finish();
    }
}

/// A GPT-2-like training step (embeddings, causal attention written out, final layernorm, tied
/// logits, cross-entropy; forward and backward) of 1 and 12 blocks.
fn gpt2_training(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan-gpt2-train");
    group.sample_size(10);
    for blocks in [1, 12] {
        let program = parse_program("gpt2.eqf", &gpt2_train_eqf(blocks, 8, 1024), &[]).expect("parses");
        describe(&format!("GPT-2 training step of {blocks}"), &program);
        group.bench_with_input(BenchmarkId::from_parameter(blocks), &program, |b, p| {
            b.iter(|| optimize(p, &opts()).expect("plans"))
        });
    }
    group.finish();
}

criterion_group!(benches, examples, stacks, transformer_stacks, skip_chains, gpt2_training);
criterion_main!(benches);
