//! Views no strides describe (a reshape of a transposed or broadcast view, such as attention's
//! heads merged back with `reshape(transpose(o, 1, 2), [B, S, E])`): the planner writes the view
//! in its own layout (attention stores it in place, anything else through a copy kernel) so
//! that every plan's kernels are ones code generation runs. Every example's plan, fused and
//! unfused, strict or not, must pass codegen; no NVRTC or GPU is needed for that.

mod common;

use eqfuse::{
    check_plan, codegen_kernel, load_program, optimize, parse_program, random_inputs, unfused_plan, Dag, DeviceProfile,
    FusionPlan, Kind, OptimizeOptions, Program, Role, Template,
};

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

fn codegen_all(what: &str, plan: &FusionPlan) {
    for k in &plan.kernels {
        if let Err(e) = codegen_kernel(plan, k) {
            panic!("{what}: kernel {} ({:?}, ops {:?}): {e}", k.id, k.template, k.ops);
        }
    }
}

/// Every example, at its declared sizes and with dims capped at 512, planned with and without
/// `--strict`, and its unfused plan (what `eqfuse bench` runs as the baseline): every kernel
/// passes codegen. The transformer blocks are among them (they failed here before).
#[test]
fn every_example_plan_passes_codegen() {
    let paths = common::example_paths();
    assert!(paths.iter().any(|p| p.ends_with("transformer_block.eqf")));
    assert!(paths.iter().any(|p| p.ends_with("transformer_block_grad.eqf")));
    let mut plans = 0;
    for path in paths {
        let full = load_program(&path, &[]).unwrap_or_else(|e| panic!("{path}: {e}"));
        let capped: Vec<(String, usize)> = full.dims.iter().map(|(n, v)| (n.clone(), (*v).min(512))).collect();
        let mut programs = vec![full];
        programs.extend(load_program(&path, &capped).ok());
        for p in &programs {
            for strict in [false, true] {
                let o = OptimizeOptions { strict, ..opts() };
                let plan = optimize(p, &o).unwrap_or_else(|e| panic!("{path}: {e}")).plan;
                codegen_all(&format!("{path} (strict {strict})"), &plan);
                let eager_input = eqfuse::expand_grads(p).unwrap();
                let unfused = unfused_plan(&eager_input, &o.profile, strict).unwrap();
                codegen_all(&format!("{path} unfused (strict {strict})"), &unfused);
                plans += 2;
            }
        }
    }
    assert!(plans >= 40, "only {plans} plans checked");
}

fn program(src: &str) -> Program {
    parse_program("views.eqf", src, &[]).unwrap()
}

/// The node of the DAG computing `reshape(transpose(o, 1, 2), ...)`'s transpose is a computed
/// tensor (a layout copy); a transpose a reshape can read in place stays a view.
#[test]
fn only_views_no_strides_describe_are_layout_copies() {
    let p = program(
        "input o: f32[2, 3, 4, 5]\n\
         a = reshape(transpose(o, 1, 2), [2, 4, 15])\n\
         b = reshape(transpose(o, 2, 3), [2, 3, 5, 2, 2])\n\
         c = reshape(broadcast(reshape(o, [2, 3, 1, 20]), [2, 3, 2, 20]), [2, 6, 20])\n\
         output a, b, c\n",
    );
    let dag = Dag::from_program(&p);
    let roles =
        |k: Kind| -> Vec<Role> { dag.nodes.iter().filter(|n| n.kind() == Some(k)).map(|n| n.role).collect::<Vec<_>>() };
    // transpose(o, 1, 2) merged with the next axis: no strides; transpose(o, 2, 3) only split.
    assert_eq!(roles(Kind::Transpose), [Role::Compute, Role::View]);
    // A broadcast merged with the axis before it: no strides either.
    assert_eq!(roles(Kind::Broadcast), [Role::Compute]);
    assert!(dag.nodes.iter().filter(|n| n.kind() == Some(Kind::Reshape)).all(|n| n.role == Role::View));
}

/// A broadcast merged with the axis before it stays a view where attention alone reads it: the
/// attention template indexes such batch axes by factors (grouped-query keys and values).
#[test]
fn grouped_keys_read_by_attention_alone_are_views() {
    let grouped =
        |x: &str| format!("reshape(broadcast(reshape({x}, [2, 3, 1, 5, 8]), [2, 3, 4, 5, 8]), [2, 12, 5, 8])");
    let p = program(&format!(
        "input q: f32[2, 12, 5, 8]\ninput k: f32[2, 3, 5, 8]\ninput v: f32[2, 3, 5, 8]\n\
         o = attention(q, {}, {}, 0.3, 1)\nw = exp({})\noutput o, w\n",
        grouped("k"),
        grouped("v"),
        grouped("k")
    ));
    let dag = Dag::from_program(&p);
    let broadcast_roles: Vec<Role> =
        dag.nodes.iter().filter(|n| n.kind() == Some(Kind::Broadcast)).map(|n| n.role).collect();
    // k's broadcast is read by attention and by `exp` (an elementwise kernel indexes by plain
    // strides): a layout copy; v's is read by attention alone: a view.
    assert_eq!(broadcast_roles, [Role::Compute, Role::View]);
}

fn checked(p: &Program, plan: &FusionPlan) {
    codegen_all(&p.source, plan);
    let inputs = random_inputs(p, 7);
    for (out, cmp) in check_plan(p, plan, &inputs).unwrap() {
        assert!(cmp.ok(), "output {out}: {cmp}");
    }
}

/// Attention's heads merged back for the output projection: the attention kernel writes its
/// output as `[B, S, H, D]` (no copy kernel), and the projection reads it in place.
#[test]
fn attention_writes_the_layout_its_consumer_reads() {
    let p = program(
        "dim B = 2\ndim S = 64\ndim H = 2\ndim D = 16\ndim E = 32\n\
         input x: f32[B, S, E]\ninput wq: f32[E, E]\ninput wo: f32[E, E]\n\
         q = transpose(reshape(x @ wq, [B, S, H, D]), 1, 2)\n\
         k = transpose(reshape(x, [B, S, H, D]), 1, 2)\n\
         o = attention(q, k, k, 0.25, 0)\n\
         y = x + reshape(transpose(o, 1, 2), [B, S, E]) @ wo\n\
         output y\n",
    );
    let plan = optimize(&p, &opts()).unwrap().plan;
    let att: Vec<_> = plan.kernels.iter().filter(|k| k.template == Template::Attention).collect();
    assert_eq!(att.len(), 1, "{:#?}", plan.kernels);
    assert_eq!(att[0].writes[0].ty.shape, [2, 64, 2, 16], "attention writes [B, S, H, D]");
    assert!(
        !plan.kernels.iter().any(|k| k.template == Template::Elementwise && k.ops == ["transpose"]),
        "no copy kernel: {:#?}",
        plan.kernels
    );
    checked(&p, &plan);
    let unfused = unfused_plan(&p, &opts().profile, false).unwrap();
    codegen_all("unfused", &unfused);
}

/// A product's output transposed and merged for another product (the backward of attention's
/// value projection): no template writes it transposed, so a copy kernel does, charged its
/// traffic; the plan runs on the reference and passes codegen.
#[test]
fn a_product_read_through_a_merged_transpose_gets_a_copy_kernel() {
    let p = program(
        "dim B = 2\ndim S = 32\ndim H = 2\ndim D = 16\ndim E = 32\n\
         input p: f32[B, H, S, S]\ninput v: f32[B, H, S, D]\ninput w: f32[E, E]\n\
         y = reshape(transpose(p @ v, 1, 2), [B, S, E]) @ w\n\
         output y\n",
    );
    let plan = optimize(&p, &opts()).unwrap().plan;
    let copies: Vec<_> =
        plan.kernels.iter().filter(|k| k.template == Template::Elementwise && k.ops == ["transpose"]).collect();
    assert_eq!(copies.len(), 1, "{:#?}", plan.kernels);
    let bytes = 2 * 32 * 32 * 4;
    assert_eq!(copies[0].bytes_read + copies[0].bytes_written, 2 * bytes, "a copy reads and writes the tensor once");
    checked(&p, &plan);
}

/// Index generators seen through views (`transpose(onehot(t, C), 0, 1)`, `reshape(iota(S),
/// [S, 1])` and its transpose, a broadcast row index) are computed in the kernels that read
/// them, at each element: no kernel writes an iota or a one-hot, and every kernel passes codegen
/// and the plan the CPU reference. (Before, each was a kernel of its own; the transposed one-hot
/// of a 1000-class log-softmax was 62.6 MiB written and read again.) The GPU tests run the
/// same program (`tests/cases/ok/index_views.eqf`) against the CPU reference.
#[test]
fn index_generators_seen_through_views_fuse_into_their_readers() {
    let p = load_program("tests/cases/ok/index_views.eqf", &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    for k in &plan.kernels {
        let writes_index = k.ops.iter().all(|o| matches!(o.as_str(), "iota" | "onehot" | "reshape" | "transpose"));
        assert!(!writes_index, "a kernel computes only indices: {:?}", k.ops);
    }
    assert_eq!(plan.kernels.len(), 2, "{:#?}", plan.kernels.iter().map(|k| &k.ops).collect::<Vec<_>>());
    checked(&p, &plan);
    // The log-softmax and NLL with classes along axis 0 reads its logits once (the maximum
    // and the shifted sum as the column template's online pair: a running maximum with the sum
    // rescaled to it; the one pass that took exp(x) * exp(-max) was NaN past logits of 88:
    // tests/overflow.rs) and writes no one-hot.
    let nll = program(
        "dim C = 1000\ndim N = 4096\ninput logits: f32[C, N]\ninput target: i32[N]\n\
         lp = log_softmax(logits, 0)\n\
         picked = sum(lp * transpose(onehot(target, C), 0, 1), 0)\n\
         loss = neg(sum(picked, 1)) / N\noutput loss\n",
    );
    let plan = optimize(&nll, &opts()).unwrap().plan;
    let logits = (1000 * 4096 * 4) as u64;
    assert!(plan.total.bytes < logits + logits / 8, "{} bytes: {:#?}", plan.total.bytes, plan.kernels);
    checked(&nll, &plan);
}

/// Inputs read transposed: a body whose input's contiguous axis is not the iteration space's
/// last takes the elementwise template's tiled path (`EQ_TILED`) wherever its tile touches fewer
/// sectors than the plain path's lanes do, and is priced as a contiguous kernel there; the
/// `[N, 2]` input read as `[2, N]` (a tile would use 8 bytes of each sector, the plain lanes
/// 16) stays on the plain path, priced by the sectors it touches. Every plan matches the
/// reference.
#[test]
fn transposed_reads_take_the_tiled_path_where_it_touches_fewer_sectors() {
    for (name, text) in common::transposed_programs() {
        let p = parse_program(&name, &text, &[]).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        checked(&p, &plan);
        let tiled = plan.kernels.iter().any(|k| {
            let s = codegen_kernel(&plan, k).unwrap();
            s.source.contains("#define EQ_TILED 1")
        });
        assert_eq!(tiled, name != "pairs_f32", "{name}");
    }
}

/// A transpose whose tiled axis and last axis are both short (a [4, 2, 999, 3] tensor with its
/// axes of 2 and 3 swapped: tiles of 3 x 2 elements in 32 x 32 slots) stays on the plain path,
/// whose lanes touch 3 sectors a sector used; one pairing a short last axis with a long tiled
/// axis (8 x 999: a quarter of the slots filled) keeps the tile. Both plans match the reference.
#[test]
fn transposes_of_short_axes_stay_on_the_plain_path() {
    for (text, tiled) in [
        ("input x: f32[4, 2, 999, 3]\ny = transpose(x, 3, -3)\noutput y\n", false),
        ("input x: f32[999, 4, 8]\ny = transpose(x, 0, 2) * 2.0\noutput y\n", true),
    ] {
        let p = parse_program("short.eqf", text, &[]).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        checked(&p, &plan);
        assert_eq!(plan.kernels.len(), 1, "{text}");
        let s = codegen_kernel(&plan, &plan.kernels[0]).unwrap();
        assert_eq!(s.source.contains("#define EQ_TILED 1"), tiled, "{text}");
    }
}

/// A transposed read on the plain path costs the sectors its lanes touch: at sizes where the
/// plain path runs it (`[N, 2]` read as `[2, N]`: 16 of each 32-byte sector used), it is priced
/// above a contiguous kernel moving the same bytes.
#[test]
fn strided_reads_are_priced_by_their_sectors() {
    let n = 1 << 22;
    let price = |text: String| {
        let plan = optimize(&program(&text), &opts()).unwrap().plan;
        assert_eq!(plan.kernels.len(), 1);
        plan.kernels[0].predicted_us
    };
    let strided = price(format!("input x: f32[{n}, 2]\ny = transpose(x, 0, 1) + 1.0\noutput y\n"));
    let contiguous = price(format!("input x: f32[2, {n}]\ny = x + 1.0\noutput y\n"));
    assert!(strided > 1.2 * contiguous, "strided {strided} us, contiguous {contiguous} us");
}
