//! Respellings (issue 20): the plan of a program must not depend on how it is spelled. Each
//! family below is one computation (one set of inputs and outputs) written several ways: axes
//! counted from the front or the back, a division against a product with the reciprocal, `x ^ 2`
//! against `x * x`, `sqrt` against `rsqrt`, named against inlined intermediates, a composite
//! against its decomposition, attention's scale and causal mask in their usual spellings.
//! Every spelling is planned at the family's sizes with the h100 profile and must be predicted
//! within 2% of the fastest spelling of its family; every spelling's plan is also checked
//! against the CPU reference at small sizes. Spellings the planner does not yet bring together
//! are listed in [`KNOWN`] with the reason; they are still checked against the reference.

use eqfuse::{
    check_plan, optimize, parse_program, random_inputs, DeviceProfile, FusionPlan, OptimizeOptions, Template,
};

/// One computation and its spellings.
struct Family {
    name: &'static str,
    /// Dims and inputs, shared by every spelling.
    header: &'static str,
    /// Sizes for the reference check.
    small: &'static [(&'static str, usize)],
    /// (label, the statements after the header, outputs included).
    spellings: &'static [(&'static str, &'static str)],
}

/// Spellings not yet planned within 2% of their family's best: (family, label, why).
const KNOWN: &[(&str, &str, &str)] = &[(
    "attention_heads",
    "keys_transposed_once",
    "the keys' transpose is spelled as one permutation of the projection (`transpose(transpose(r, 1, 3), 1, 2)` \
     for `transpose(transpose(r, 1, 2), -1, -2)`): the rules cancel a transpose of the same two axes but do not \
     compose swaps of different axes, so no `q @ transpose(k, -1, -2)` is found",
)];

const TOLERANCE: f64 = 1.02;

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

fn source(f: &Family, body: &str) -> String {
    format!("{}\n{}\n", f.header.trim(), body.trim())
}

/// Plans every spelling; returns each one's plan.
fn plan_all(f: &Family) -> Vec<(&'static str, FusionPlan)> {
    let mut plans = vec![];
    for (label, body) in f.spellings {
        let file = format!("{}_{label}.eqf", f.name);
        let p = parse_program(&file, &source(f, body), &[]).unwrap_or_else(|e| panic!("{file}: {e}"));
        let plan = optimize(&p, &opts()).unwrap_or_else(|e| panic!("{file}: {e}")).plan;
        plans.push((*label, plan));
    }
    plans
}

/// The family's spellings plan within 2% of the best, and compute the program at small sizes.
fn check(f: &Family) -> Vec<(&'static str, FusionPlan)> {
    let plans = plan_all(f);
    let best = plans.iter().map(|(_, p)| p.total.predicted_us).fold(f64::INFINITY, f64::min);
    let mut slow = vec![];
    for (label, plan) in &plans {
        let t = plan.total.predicted_us;
        let known = KNOWN.iter().any(|(fam, l, _)| *fam == f.name && l == label);
        eprintln!("{:<20} {label:<24} {t:>10.1} us {:>3} kernels {}", f.name, plan.total.kernels, plan.total.bytes);
        if t > best * TOLERANCE && !known {
            slow.push(format!("{label}: {t:.1} us ({} kernels: {})", plan.total.kernels, ops(plan)));
        } else if t <= best * TOLERANCE && known {
            eprintln!("{}: {label} is listed in KNOWN but now plans within 2% of the best", f.name);
        }
    }
    assert!(slow.is_empty(), "{}: best {best:.1} us; slower than 2% over it:\n  {}", f.name, slow.join("\n  "));
    let small: Vec<(String, usize)> = f.small.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    for (label, body) in f.spellings {
        let file = format!("{}_{label}.eqf", f.name);
        let p = parse_program(&file, &source(f, body), &small).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        for (out, cmp) in check_plan(&p, &plan, &random_inputs(&p, 11)).unwrap() {
            assert!(cmp.ok(), "{file} at small sizes, output {out}: {cmp}");
        }
    }
    plans
}

fn ops(plan: &FusionPlan) -> String {
    plan.kernels.iter().map(|k| format!("{:?}[{}]", k.template, k.ops.join(" "))).collect::<Vec<_>>().join(", ")
}

/// Every spelling is one attention kernel that reads q, k and v (or the tensors they are views
/// of) and writes the output once.
fn one_attention_kernel(f: &Family, plans: &[(&'static str, FusionPlan)]) {
    for (label, plan) in plans {
        let att: Vec<_> = plan.kernels.iter().filter(|k| k.template == Template::Attention).collect();
        assert_eq!((plan.total.kernels, att.len()), (1, 1), "{} {label}: {}", f.name, ops(plan));
        let floor: u64 = att[0].reads.iter().chain(&att[0].writes).map(|t| t.ty.bytes()).sum();
        assert_eq!(plan.total.bytes, floor, "{} {label}: {}", f.name, ops(plan));
    }
}

const ATTENTION_HEADER: &str = "
dim B = 8
dim H = 16
dim S = 2048
dim D = 64
input q: bf16[B, H, S, D]
input k: bf16[B, H, S, D]
input v: bf16[B, H, S, D]
";
const ATTENTION_SMALL: &[(&str, usize)] = &[("B", 1), ("H", 2), ("S", 24), ("D", 16)];

/// examples/attention.eqf.
const ATTENTION: Family = Family {
    name: "attention",
    header: ATTENTION_HEADER,
    small: ATTENTION_SMALL,
    spellings: &[
        (
            "example",
            "s = q @ transpose(k, -1, -2) * 0.125\ne = exp(s - amax(s, -1))\np = e / sum(e, -1)\no = p @ v\noutput o",
        ),
        ("composite", "o = attention(q, k, v, 0.125, 0)\noutput o"),
        ("softmax", "o = softmax(q @ transpose(k, -1, -2) * 0.125, -1) @ v\noutput o"),
        ("inlined", "o = exp(q @ transpose(k, -1, -2) * 0.125 - amax(q @ transpose(k, -1, -2) * 0.125, -1)) / sum(exp(q @ transpose(k, -1, -2) * 0.125 - amax(q @ transpose(k, -1, -2) * 0.125, -1)), -1) @ v\noutput o"),
        (
            "positive_axes",
            "s = q @ transpose(k, 2, 3) * 0.125\ne = exp(s - amax(s, 3))\np = e / sum(e, 3)\no = p @ v\noutput o",
        ),
        ("swapped_axes", "o = softmax(q @ transpose(k, 3, 2) * 0.125, 3) @ v\noutput o"),
        ("div", "s = q @ transpose(k, -1, -2) / 8\no = softmax(s, -1) @ v\noutput o"),
        ("div_sqrt", "s = q @ transpose(k, -1, -2) / sqrt(D)\no = softmax(s, -1) @ v\noutput o"),
        ("mul_rsqrt", "s = q @ transpose(k, -1, -2) * rsqrt(D)\no = softmax(s, -1) @ v\noutput o"),
        ("scale_q", "s = (q * 0.125) @ transpose(k, -1, -2)\no = softmax(s, -1) @ v\noutput o"),
        ("div_q", "s = (q / sqrt(D)) @ transpose(k, -1, -2)\no = softmax(s, -1) @ v\noutput o"),
        ("scale_k", "s = q @ transpose(k * 0.125, -1, -2)\no = softmax(s, -1) @ v\noutput o"),
        (
            "recip",
            "s = q @ transpose(k, -1, -2) * 0.125\ne = exp(s - amax(s, -1))\np = e * recip(sum(e, -1))\no = p @ v\noutput o",
        ),
        ("unshifted", "s = q @ transpose(k, -1, -2) * 0.125\ne = exp(s)\no = e / sum(e, -1) @ v\noutput o"),
    ],
};

/// Causal attention, the mask built from `iota`.
const CAUSAL: Family = Family {
    name: "causal_attention",
    header: ATTENTION_HEADER,
    small: ATTENTION_SMALL,
    spellings: &[
        ("composite", "o = attention(q, k, v, 0.125, 1)\noutput o"),
        (
            "where",
            "s = q @ transpose(k, -1, -2) * 0.125\nrow = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             o = softmax(where(col <= row, s, -1e30), -1) @ v\noutput o",
        ),
        (
            "where_masked",
            "s = q @ transpose(k, -1, -2) * 0.125\nrow = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             o = softmax(where(col > row, -1e9, s), -1) @ v\noutput o",
        ),
        (
            "where_not",
            "s = q @ transpose(k, -1, -2) * 0.125\nrow = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             o = softmax(where(not(row < col), s, -10000), -1) @ v\noutput o",
        ),
        (
            "where_decomposed",
            "s = q @ transpose(k, 2, 3) / sqrt(D)\nrow = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             m = where(row >= col, s, -1e30)\ne = exp(m - amax(m, 3))\no = e / sum(e, 3) @ v\noutput o",
        ),
        (
            "where_broadcast",
            "s = q @ transpose(k, -1, -2) * 0.125\nrow = broadcast(reshape(iota(S), [S, 1]), [S, S])\n\
             col = broadcast(iota(S), [S, S])\nkeep = broadcast(row - col >= 0, [B, H, S, S])\n\
             o = softmax(where(keep, s, -1e30), -1) @ v\noutput o",
        ),
        (
            "where_f32_index",
            "s = (q * 0.125) @ transpose(k, -1, -2)\nrow = cast(reshape(iota(S), [S, 1]), f32)\n\
             col = cast(iota(S), f32)\no = softmax(where(col < row + 1, s, -1e30), -1) @ v\noutput o",
        ),
        (
            "additive",
            "s = q @ transpose(k, -1, -2) * 0.125\nrow = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             mask = cast(where(col > row, -1e30, 0), bf16)\no = softmax(s + mask, -1) @ v\noutput o",
        ),
        (
            "additive_product",
            "s = q @ transpose(k, -1, -2) / 8\nrow = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             mask = cast(col > row, bf16) * -1e9\no = softmax(s + mask, -1) @ v\noutput o",
        ),
        (
            "additive_first",
            "s = q @ transpose(k, -1, -2) * 0.125\nrow = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             mask = cast(where(col <= row, 0, -1e30), bf16)\no = softmax(mask + s, -1) @ v\noutput o",
        ),
    ],
};

/// Heads split out of `[B, S, H*D]` projections by reshape and transpose, and merged back.
const HEADS: Family = Family {
    name: "attention_heads",
    header: "
dim B = 8
dim S = 2048
dim H = 16
dim D = 64
dim E = 1024
input xq: bf16[B, S, E]
input xk: bf16[B, S, E]
input xv: bf16[B, S, E]
q = transpose(reshape(xq, [B, S, H, D]), 1, 2)
k = transpose(reshape(xk, [B, S, H, D]), 1, 2)
v = transpose(reshape(xv, [B, S, H, D]), 1, 2)
",
    small: &[("B", 1), ("S", 24), ("H", 2), ("D", 16), ("E", 32)],
    spellings: &[
        ("composite", "o = attention(q, k, v, 0.125, 0)\ny = reshape(transpose(o, 1, 2), [B, S, E])\noutput y"),
        (
            "decomposed",
            "s = q @ transpose(k, -1, -2) * 0.125\ne = exp(s - amax(s, -1))\np = e / sum(e, -1)\n\
             y = reshape(transpose(p @ v, 1, 2), [B, S, E])\noutput y",
        ),
        (
            "positive_axes",
            "s = q @ transpose(k, 2, 3) / sqrt(D)\no = softmax(s, 3) @ v\ny = reshape(transpose(o, 2, 1), [B, S, E])\noutput y",
        ),
        (
            "keys_transposed_once",
            "kt = transpose(reshape(xk, [B, S, H, D]), 1, 3)\nkt2 = transpose(kt, 1, 2)\n\
             o = softmax(q @ kt2 * 0.125, -1) @ v\ny = reshape(transpose(o, 1, 2), [B, S, E])\noutput y",
        ),
    ],
};

/// Causal attention of heads split out of projections.
const CAUSAL_HEADS: Family = Family {
    name: "causal_attention_heads",
    header: HEADS.header,
    small: HEADS.small,
    spellings: &[
        ("composite", "o = attention(q, k, v, 0.125, 1)\ny = reshape(transpose(o, 1, 2), [B, S, E])\noutput y"),
        (
            "where",
            "s = (q / sqrt(D)) @ transpose(k, 2, 3)\nrow = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             o = softmax(where(col <= row, s, -1e30), -1) @ v\ny = reshape(transpose(o, 1, 2), [B, S, E])\noutput y",
        ),
        (
            "additive",
            "s = q @ transpose(k, -1, -2) * 0.125\nrow = reshape(iota(S), [S, 1])\ncol = iota(S)\n\
             mask = cast(where(col > row, -1e30, 0), bf16)\no = softmax(s + mask, -1) @ v\n\
             y = reshape(transpose(o, 1, 2), [B, S, E])\noutput y",
        ),
    ],
};

#[test]
fn attention_spellings() {
    let plans = check(&ATTENTION);
    one_attention_kernel(&ATTENTION, &plans);
}

#[test]
fn causal_attention_spellings() {
    let plans = check(&CAUSAL);
    one_attention_kernel(&CAUSAL, &plans);
    for (label, plan) in &plans {
        assert_eq!(plan.kernels[0].ops, ["attention"], "{label}");
    }
}

#[test]
fn attention_heads_spellings() {
    let plans = check(&HEADS);
    one_attention_kernel(&HEADS, &plans);
}

#[test]
fn causal_attention_heads_spellings() {
    let plans = check(&CAUSAL_HEADS);
    one_attention_kernel(&CAUSAL_HEADS, &plans);
}
