//! `eqfuse explain`: why the plan is what it is.
//!
//! Lists the rewrites that fired (per ruleset stage, with counts), the rules the chosen form
//! depends on (with the inexact ones named, when the search recorded explanations), the composite
//! operators the search recognised in the program, and for each kernel the fusions rejected near
//! it and why.
//! Invariant: everything it prints comes from the search and plan records; it recomputes nothing.

use std::fmt::Write as _;

use crate::plan::render::human_bytes;
use crate::search::optimize::Optimized;

/// The explanation of a plan, as text for a terminal.
pub fn explain(opt: &Optimized) -> String {
    let plan = &opt.plan;
    let mut s = format!("explain {} on {}\n\n", plan.program, plan.device);
    s.push_str("rewrites:\n");
    if opt.stages.is_empty() {
        s.push_str("  (no rulesets ran)\n");
    }
    for st in &opt.stages {
        let total: usize = st.fired.values().sum();
        let _ = writeln!(
            s,
            "  stage {}: {} iterations, stopped: {}, {total} rewrites",
            st.ruleset, st.iterations, st.stop_detail
        );
        let mut fired: Vec<_> = st.fired.iter().filter(|(_, &n)| n > 0).collect();
        fired.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (rule, n) in fired {
            let _ = writeln!(s, "    {n:>6}  {rule}");
        }
    }
    if let Some(used) = &opt.rules_used {
        let inexact: Vec<&str> = used.iter().filter(|(_, i)| *i).map(|(r, _)| r.as_str()).collect();
        let _ = writeln!(s, "\nrules the chosen form depends on (egg's explanation of each output): {}", used.len());
        let _ = writeln!(
            s,
            "  inexact (they round differently; --strict leaves them out): {}",
            if inexact.is_empty() { "none".to_string() } else { inexact.join(", ") }
        );
        let exact: Vec<&str> = used.iter().filter(|(_, i)| !*i).map(|(r, _)| r.as_str()).collect();
        if !exact.is_empty() {
            let _ = writeln!(s, "  exact: {}", exact.join(", "));
        }
    }
    s.push_str("\ncomposite operators recognised:\n");
    if opt.recognised.is_empty() {
        s.push_str("  none\n");
    }
    for c in &opt.recognised {
        let _ = writeln!(s, "  {c}");
    }
    s.push_str("\nkernels:\n");
    for k in &plan.kernels {
        let reads: Vec<&str> = k.reads.iter().map(|r| r.name.as_str()).collect();
        let writes: Vec<&str> = k.writes.iter().map(|r| r.name.as_str()).collect();
        let _ = writeln!(
            s,
            "  kernel {} ({}): {} -> {}; {} ops, {}, {:.1} us",
            k.id,
            k.template.name(),
            reads.join(", "),
            writes.join(", "),
            k.ops.len(),
            human_bytes(k.bytes_read + k.bytes_written),
            k.predicted_us
        );
        for r in &k.rejected {
            let _ = writeln!(s, "    {r}");
        }
    }
    let _ = writeln!(
        s,
        "\n{} and {} against {} and {} unfused; predicted speedup {:.2}x",
        crate::plan::render::plural(plan.total.kernels, "kernel"),
        human_bytes(plan.total.bytes),
        crate::plan::render::plural(plan.unfused.kernels, "kernel"),
        human_bytes(plan.unfused.bytes),
        plan.speedup()
    );
    let _ = writeln!(s, "{}", crate::plan::render::memory_line(&plan.memory));
    for t in &plan.memory.saved {
        let _ = writeln!(
            s,
            "  saved {} {}{}: {}{}, written by kernel {}, last read by kernel {}",
            t.name,
            t.ty.dtype.name(),
            crate::ir::lang::Dims(t.ty.shape.clone()),
            human_bytes(t.bytes),
            if t.packed { " (1 bit per element)" } else { "" },
            t.written_by,
            t.last_read_by
        );
    }
    s
}
