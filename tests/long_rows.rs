//! Few long rows: a row kernel over fewer rows than SMs cuts each row into segments, one block
//! each, and the last block of a row to finish combines the row's partials in a fixed order
//! (`kernels/rowreduce.cu`, `EQ_SEGS`). On the CPU: the programs of
//! `common::long_row_programs` plan with the segments expected, their plans match the
//! reference kernel by kernel, the cost model prices the segments that run (a tensor of 8.4
//! million f32 summed to one value at about a full-bandwidth read, not one block's), and
//! strict numerics, which keep the unfused plan's order of summation, segment nothing.
//! (tests/nvrtc.rs compiles these kernels, tests/gpu.rs runs them on the device.)

mod common;

use eqfuse::{check_plan, codegen_plan, optimize, random_inputs, DeviceProfile, FusionPlan, OptimizeOptions, Template};

/// The `EQ_SEGS` of each generated row kernel of a plan (1 where not segmented).
fn segments(plan: &FusionPlan) -> Vec<usize> {
    codegen_plan(plan)
        .unwrap()
        .iter()
        .filter(|s| s.template == Template::RowReduce)
        .map(|s| {
            s.source.lines().find_map(|l| l.strip_prefix("#define EQ_SEGS ")).map_or(1, |n| n.trim().parse().unwrap())
        })
        .collect()
}

#[test]
fn few_long_rows_are_segmented_and_their_plans_match_the_reference() {
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for (name, text, want) in common::long_row_programs() {
        let p = eqfuse::parse_program(name, &text, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = optimize(&p, &opts).unwrap().plan;
        let segs = segments(&plan);
        assert!(segs.contains(&want), "{name}: row kernels with {segs:?} segments, not {want}");
        // The workspace holds every (row, segment)'s partials, and a zeroed count a row.
        for s in codegen_plan(&plan).unwrap().iter().filter(|s| s.source.contains("#define EQ_SEGS ")) {
            let ws: Vec<_> = s.args.iter().filter(|a| a.dtype.is_none()).map(|a| (a.name.as_str(), a.zeroed)).collect();
            assert_eq!(ws, [("eq_ws", false), ("eq_count", true)], "{name}: {}", s.name);
        }
        for (out, cmp) in check_plan(&p, &plan, &random_inputs(&p, 0)).unwrap() {
            assert!(cmp.ok(), "{name}: output {out}: {cmp:?}");
        }
    }
}

#[test]
fn strict_numerics_segment_no_rows() {
    let mut opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    opts.strict = true;
    for (name, text, _) in common::long_row_programs().into_iter().take(3) {
        let p = eqfuse::parse_program(name, &text, &[]).unwrap();
        let plan = optimize(&p, &opts).unwrap().plan;
        assert!(segments(&plan).iter().all(|&s| s == 1), "{name}: segmented under strict numerics");
    }
}

/// The one-row sum of 8388608 f32 (32 MiB): one block a row streamed it in 584 us on an H100
/// (priced 1486 us as one block); in 256 segments it is priced as a full-bandwidth read plus
/// the combine (16.6 us on the h100 profile, a copy of 32 MiB at its bandwidth being about 12).
#[test]
fn the_cost_model_prices_the_segments_that_run() {
    let profile = DeviceProfile::load("h100").unwrap();
    let text = "input x: f32[2048, 4096]\ny = sum(reshape(x, [8388608]), 0)\noutput y\n";
    let p = eqfuse::parse_program("sum", text, &[]).unwrap();
    let segmented = optimize(&p, &OptimizeOptions::new(profile.clone())).unwrap().plan;
    assert_eq!(segments(&segmented), [256]);
    let copy_us = 32.0 * 1048576.0 / (profile.copy_bandwidth_gbs * 1e3);
    let us = segmented.kernels[0].predicted_us;
    assert!(us > copy_us && us < 2.0 * copy_us, "{us} us predicted; a copy of 32 MiB takes {copy_us} us");
    // Strict numerics run one block a row, priced at the one SM it occupies.
    let mut o = OptimizeOptions::new(profile);
    o.strict = true;
    let one_block = optimize(&p, &o).unwrap().plan;
    assert_eq!(segments(&one_block), [1]);
    assert!(one_block.kernels[0].predicted_us > 50.0 * us, "{} us", one_block.kernels[0].predicted_us);
}
