//! Fitting a plan to a memory budget: the memory report of a fusion state, and the search that
//! recomputes saved tensors until the peak fits (`--memory-budget`).

use crate::ir::lang::TensorLang;
use crate::ir::types::TensorType;
use crate::plan::dag::Dag;
use crate::plan::memory::{liveness, KernelIo, MemoryReport};
use crate::search::fuse::Fusion;

/// The memory report of a fusion state over `dag` (tensor names are node indices, inputs keep
/// their names), with `inputs` the program's inputs (some may be unused by the DAG).
pub fn state_memory(dag: &Dag, f: &Fusion, inputs: &[(String, TensorType)]) -> MemoryReport {
    let name = |i: usize| match &dag.nodes[i].node {
        TensorLang::Var(s) => s.to_string(),
        _ => format!("#{i}"),
    };
    let io = f.kernel_io();
    let named: Vec<(Vec<String>, Vec<String>)> =
        io.iter().map(|(r, w)| (r.iter().map(|&i| name(i)).collect(), w.iter().map(|&i| name(i)).collect())).collect();
    let kernels: Vec<KernelIo> = named
        .iter()
        .map(|(r, w)| KernelIo {
            reads: r.iter().map(String::as_str).collect(),
            writes: w.iter().map(String::as_str).collect(),
        })
        .collect();
    let ins: Vec<(&str, &TensorType)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let out_names: Vec<String> = dag.outputs.iter().map(|&(_, i)| name(i)).collect();
    let outs: Vec<&str> = out_names.iter().map(String::as_str).collect();
    let index = |n: &str| n.strip_prefix('#').and_then(|d| d.parse::<usize>().ok());
    liveness(&kernels, &ins, &outs, &|n| index(n).and_then(|i| dag.nodes[i].ty().cloned()), &|n| {
        index(n).is_some_and(|i| dag.is_packed(i))
    })
}

/// Makes a fusion state fit a memory budget by recomputing saved tensors instead of writing them.
/// Each step recomputes the saved tensor that lowers the excess over the budget (summed over the
/// kernels, [`MemoryReport::excess`]) at the least predicted time per byte, then lets greedy
/// fusion tidy the kernels (kept only when that does not raise the excess), until the peak fits
/// or no recomputation lowers the excess. Only tensors their readers can compute in their own
/// kernels are dropped: a matrix product's operand stays in memory. When it never fits, the error is the report of the smallest peak found.
pub fn fit_budget<'a>(
    dag: &'a Dag,
    mut f: Fusion<'a>,
    inputs: &[(String, TensorType)],
    budget: u64,
) -> Result<Fusion<'a>, MemoryReport> {
    let mut mem = state_memory(dag, &f, inputs);
    while mem.peak_bytes > budget {
        let t0 = f.total_us();
        let mut best: Option<(f64, Fusion<'a>, MemoryReport)> = None;
        let saved = f.saved();
        for &m in &saved {
            let Some(next) = recompute(&f, m, &saved) else { continue };
            let nm = state_memory(dag, &next, inputs);
            let (before, after) = (mem.excess(budget), nm.excess(budget));
            if after >= before {
                continue;
            }
            let score = (next.total_us() - t0) / (before - after) as f64;
            if best.as_ref().is_none_or(|(s, _, _)| score < *s - 1e-12) {
                best = Some((score, next, nm));
            }
        }
        let Some((_, next, nm)) = best else { break };
        let mut tidy = next.clone();
        tidy.optimise();
        let tm = state_memory(dag, &tidy, inputs);
        (f, mem) = if tm.excess(budget) <= nm.excess(budget) { (tidy, tm) } else { (next, nm) };
    }
    if mem.peak_bytes > budget {
        return Err(mem);
    }
    Ok(f)
}

/// The state with `m` recomputed by its readers, and so every tensor that this would newly write
/// instead (a kernel fused from a chain keeps the chain's links materialized but unwritten, so
/// recomputing its last link alone writes the one before). `None` when a template cannot run it.
fn recompute<'a>(f: &Fusion<'a>, m: usize, saved: &[usize]) -> Option<Fusion<'a>> {
    let mut next = f.recomputed(m).ok()?;
    // Each step stops materializing one more tensor, so this ends.
    loop {
        let Some(&x) = next.saved().iter().find(|x| !saved.contains(x)) else { return Some(next) };
        next = next.recomputed(x).ok()?;
    }
}
