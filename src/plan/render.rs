//! Rendering a plan: the JSON contract, a terminal table, plain text and Graphviz DOT.
//!
//! Invariant: rendering is a pure function of the plan (and the fields the JSON contract of
//! DESIGN.md §4 fixes are always present), so equal plans render byte-identically.

use std::fmt::Write as _;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use egg::Language;
use serde_json::{json, Value};

use crate::ir::lang::TensorLang;
use crate::plan::{FusionPlan, Kernel, Totals};

/// Output formats of `eqfuse optimize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Text,
    Dot,
}

/// Renders a plan in a format.
pub fn render(plan: &FusionPlan, format: Format) -> String {
    match format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(&plan_json(plan)).expect("plain JSON values serialize");
            s.push('\n');
            s
        }
        Format::Table => render_table(plan),
        Format::Text => render_text(plan),
        Format::Dot => render_dot(plan),
    }
}

/// Microseconds rounded to 0.001 (`+ 0.0` turns a -0.0 into 0.0).
fn us(x: f64) -> f64 {
    (x * 1e3).round() / 1e3 + 0.0
}

/// `n word` or `n words` (`1 kernel`, `2 kernels`, `3 e-classes`).
pub(crate) fn plural(n: usize, word: &str) -> String {
    match (n, word.ends_with('s')) {
        (1, _) => format!("1 {word}"),
        (_, true) => format!("{n} {word}es"),
        _ => format!("{n} {word}s"),
    }
}

fn kernel_json(k: &Kernel) -> Value {
    let mut v = json!({
        "id": k.id,
        "template": k.template.name(),
        "ops": k.ops,
        "reads": k.reads.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        "writes": k.writes.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
        "bytes_read": k.bytes_read,
        "bytes_written": k.bytes_written,
        "flops": k.flops,
        "predicted_us": us(k.predicted_us),
        "domain": k.domain,
        "body": k.body_text(),
        "rejected": k.rejected,
    });
    if let (Some(imp), Some(o)) = (k.implementation, v.as_object_mut()) {
        o.insert("implementation".into(), json!(imp.name()));
    }
    v
}

/// The template's name, with a gemm kernel's implementation (`gemm/cublaslt`).
fn template_label(k: &Kernel) -> String {
    match k.implementation {
        Some(imp) => format!("{}/{}", k.template.name(), imp.name()),
        None => k.template.name().to_string(),
    }
}

/// The plan as the JSON contract (`eqfuse.plan/1`).
pub fn plan_json(plan: &FusionPlan) -> Value {
    let mut v = json!({
        "schema": "eqfuse.plan/1",
        "program": plan.program,
        "device": plan.device,
        "kernels": plan.kernels.iter().map(kernel_json).collect::<Vec<_>>(),
        "total": {"kernels": plan.total.kernels, "bytes": plan.total.bytes, "flops": plan.total.flops,
                  "predicted_us": us(plan.total.predicted_us)},
        "unfused": {"kernels": plan.unfused.kernels, "bytes": plan.unfused.bytes,
                    "predicted_us": us(plan.unfused.predicted_us)},
        "search": {
            "iterations": plan.search.iterations,
            "enodes": plan.search.enodes,
            "eclasses": plan.search.eclasses,
            "stop_reason": plan.search.stop_reason,
            "saturate_ms": plan.search.saturate_ms,
            "extract_ms": plan.search.extract_ms,
            "extractor": plan.search.extractor,
            "gap": plan.search.gap,
            "stop_detail": plan.search.stop_detail,
            "time_limit_s": plan.search.time_limit_s,
            "time_limit_cut": plan.search.time_limit_cut,
        },
        "inputs": plan.inputs.iter().map(|i| json!({"name": i.name, "dtype": i.ty.dtype, "shape": i.ty.shape})).collect::<Vec<_>>(),
        "outputs": plan.outputs.iter().map(|(o, t)| json!({"name": o, "tensor": t})).collect::<Vec<_>>(),
        "memory": memory_json(&plan.memory),
    });
    if plan.search.strict {
        v["strict"] = Value::Bool(true);
    }
    v
}

fn memory_json(m: &crate::plan::memory::MemoryReport) -> Value {
    let mut v = json!({
        "peak_bytes": m.peak_bytes,
        "peak_kernel": m.peak_kernel,
        "inputs_bytes": m.inputs_bytes,
        "outputs_bytes": m.outputs_bytes,
        "saved_bytes": m.saved.iter().map(|s| s.bytes).sum::<u64>(),
        "saved": m.saved.iter().map(|s| {
            let mut e = json!({
                "tensor": s.name, "dtype": s.ty.dtype, "shape": s.ty.shape, "bytes": s.bytes, "packed": s.packed,
                "written_by": s.written_by, "last_read_by": s.last_read_by,
            });
            // A packed mask also says what it would take one byte per element.
            if s.packed {
                e["unpacked_bytes"] = json!(s.ty.bytes());
            }
            e
        }).collect::<Vec<_>>(),
        "budget_bytes": m.budget_bytes,
    });
    // With packed masks: the bytes they save over one byte per element (memory and traffic of
    // the mask itself; what the plan saves by keeping a mask instead of the value it came from
    // is in the totals).
    let masks_saved: u64 = m.saved.iter().filter(|s| s.packed).map(|s| s.ty.bytes().saturating_sub(s.bytes)).sum();
    if m.saved.iter().any(|s| s.packed) {
        v["masks_saved_bytes"] = json!(masks_saved);
    }
    v
}

/// One line on device memory: the peak, what is saved between kernels, packed masks, the budget.
pub fn memory_line(m: &crate::plan::memory::MemoryReport) -> String {
    let saved: u64 = m.saved.iter().map(|s| s.bytes).sum();
    let packed: Vec<&str> = m.saved.iter().filter(|s| s.packed).map(|s| s.name.as_str()).collect();
    let mut s = format!(
        "memory: peak {}{} (inputs {}, outputs {}); {} saved between kernels in {}",
        human_bytes(m.peak_bytes),
        m.peak_kernel.map_or(String::new(), |k| format!(" at kernel {k}")),
        human_bytes(m.inputs_bytes),
        human_bytes(m.outputs_bytes),
        human_bytes(saved),
        plural(m.saved.len(), "tensor")
    );
    if !packed.is_empty() {
        s.push_str(&format!(", 1-bit masks: {}", packed.join(", ")));
    }
    if let Some(b) = m.budget_bytes {
        s.push_str(&format!("; budget {}", human_bytes(b)));
    }
    s
}

/// Bytes with a binary unit.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

fn summary(plan: &FusionPlan) -> String {
    let t: &Totals = &plan.total;
    let u = &plan.unfused;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "fused:   {}, {}, {:.1} us predicted",
        plural(t.kernels, "kernel"),
        human_bytes(t.bytes),
        us(t.predicted_us)
    );
    let _ = writeln!(
        s,
        "unfused: {}, {}, {:.1} us predicted",
        plural(u.kernels, "kernel"),
        human_bytes(u.bytes),
        us(u.predicted_us)
    );
    let saved = u.bytes.saturating_sub(t.bytes);
    let speedup = if t.kernels == 0 && u.kernels > 0 {
        "no kernel left to run".to_string()
    } else {
        format!("predicted speedup {:.2}x", plan.speedup())
    };
    let _ = writeln!(s, "saves {} of traffic; {speedup} on {}", human_bytes(saved), plan.device);
    let _ = writeln!(s, "{}", memory_line(&plan.memory));
    let se = &plan.search;
    let gap = se.gap.map_or("not computed".to_string(), |g| format!("{:.1}%", g * 100.0));
    let _ = writeln!(
        s,
        "search: {}, {} in {}, stopped: {}; saturate {:.1} ms, extract {:.1} ms ({}), gap {gap}",
        plural(se.iterations, "iteration"),
        plural(se.enodes, "e-node"),
        plural(se.eclasses, "e-class"),
        if se.stop_detail.is_empty() { &se.stop_reason } else { &se.stop_detail },
        se.saturate_ms,
        se.extract_ms,
        se.extractor
    );
    if !se.time_limit_cut.is_empty() {
        let _ = writeln!(
            s,
            "time limit of {} s reached: it cut {}; the plan is the best complete one found before it",
            se.time_limit_s,
            se.time_limit_cut.join(", ")
        );
    }
    s
}

fn render_table(plan: &FusionPlan) -> String {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec!["#", "template", "ops", "reads", "writes", "bytes", "predicted us"]);
    for k in &plan.kernels {
        table.add_row(vec![
            Cell::new(k.id),
            Cell::new(template_label(k)),
            Cell::new(wrap_list(&k.ops, 40)),
            Cell::new(k.reads.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ")),
            Cell::new(k.writes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ")),
            Cell::new(human_bytes(k.bytes_read + k.bytes_written)).set_alignment(CellAlignment::Right),
            Cell::new(format!("{:.1}", k.predicted_us)).set_alignment(CellAlignment::Right),
        ]);
    }
    format!("{}: plan for {}\n{table}\n{}", plan.program, plan.device, summary(plan))
}

/// Joins words, breaking lines near `width` characters.
fn wrap_list(items: &[String], width: usize) -> String {
    let mut out = String::new();
    let mut line = 0;
    for (i, it) in items.iter().enumerate() {
        if i > 0 {
            if line + it.len() + 1 > width {
                out.push('\n');
                line = 0;
            } else {
                out.push(' ');
                line += 1;
            }
        }
        out.push_str(it);
        line += it.len();
    }
    out
}

fn render_text(plan: &FusionPlan) -> String {
    let mut s = format!("plan for {} on {}\n", plan.program, plan.device);
    for k in &plan.kernels {
        let names = |v: &[crate::plan::TensorRef]| {
            v.iter().map(|t| format!("{} {}", t.name, t.ty)).collect::<Vec<_>>().join(", ")
        };
        let _ =
            writeln!(s, "kernel {} ({} over {}):", k.id, template_label(k), crate::ir::lang::Dims(k.domain.clone()));
        let _ = writeln!(s, "  reads  {}", names(&k.reads));
        let _ = writeln!(s, "  writes {}", names(&k.writes));
        let _ = writeln!(s, "  body   {}", k.body_text());
        let _ = writeln!(
            s,
            "  {} read, {} written, {} flops, {:.1} us predicted",
            human_bytes(k.bytes_read),
            human_bytes(k.bytes_written),
            k.flops,
            k.predicted_us
        );
        for r in &k.rejected {
            let _ = writeln!(s, "  {r}");
        }
    }
    s.push_str(&summary(plan));
    s
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn render_dot(plan: &FusionPlan) -> String {
    let mut s = String::from("digraph plan {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n");
    let mut tensors = std::collections::BTreeSet::new();
    for k in &plan.kernels {
        for t in k.reads.iter().chain(&k.writes) {
            tensors.insert((t.name.clone(), t.ty.to_string()));
        }
    }
    for (name, ty) in &tensors {
        let _ = writeln!(
            s,
            "  \"m_{0}\" [shape=box, style=filled, fillcolor=lightgrey, label=\"{0}\\n{1}\"];",
            dot_escape(name),
            ty
        );
    }
    for k in &plan.kernels {
        let _ = writeln!(s, "  subgraph cluster_{} {{", k.id);
        let _ = writeln!(s, "    label=\"kernel {} ({}) {:.1} us\";", k.id, k.template.name(), k.predicted_us);
        let nodes = k.body.as_ref();
        for (i, n) in nodes.iter().enumerate() {
            if matches!(n, TensorLang::Var(_)) || n.is_leaf() && !matches!(n, TensorLang::Num(_)) {
                continue;
            }
            let _ = writeln!(s, "    \"k{}_{}\" [label=\"{}\"];", k.id, i, dot_escape(&n.head()));
        }
        s.push_str("  }\n");
        for (i, n) in nodes.iter().enumerate() {
            for &c in n.children() {
                let ci = usize::from(c);
                match &nodes[ci] {
                    TensorLang::Var(v) => {
                        let _ = writeln!(s, "  \"m_{}\" -> \"k{}_{}\";", dot_escape(v.as_str()), k.id, i);
                    }
                    TensorLang::Num(_) | TensorLang::Op(..) => {
                        let _ = writeln!(s, "  \"k{0}_{1}\" -> \"k{0}_{2}\";", k.id, ci, i);
                    }
                    _ => {}
                }
            }
        }
        for (w, &st) in k.writes.iter().zip(&k.stores) {
            let _ = writeln!(s, "  \"k{}_{}\" -> \"m_{}\";", k.id, usize::from(st), dot_escape(&w.name));
        }
    }
    s.push_str("}\n");
    s
}
