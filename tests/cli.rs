//! The command line's input surfaces, run through the binary: options, device profiles, files
//! and option combinations. Every bad input is `error: ...` naming what is wrong, with exit status
//! 1 (bad input) or 2 (a usage error), never a panic and never silently wrong output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const SMALL: &str = "dim N = 8\ninput x: f32[N]\ninput y: f32[N]\nout = (x + y) * 2\noutput out\n";

fn eqfuse(args: &[&str]) -> Output {
    eqfuse_in(args, None)
}

fn eqfuse_in(args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_eqfuse"));
    cmd.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the binary runs");
    if let Some(text) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts the exit status and that standard error starts with `error:` and contains `text`
/// (and no panic).
fn fails(o: &Output, code: i32, text: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "expected exit {code}:\n{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(text), "expected `{text}` in:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn small(dir: &Path) -> String {
    let p = dir.join("small.eqf");
    std::fs::write(&p, SMALL).unwrap();
    p.display().to_string()
}

#[test]
fn option_values_are_usage_errors() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    let cases: &[(&[&str], &str)] = &[
        (&["--time-limit", "1e20"], "at most 1000000 seconds"),
        (&["--time-limit", "-1"], "more than 0"),
        (&["--time-limit", "0"], "more than 0"),
        (&["--time-limit", "nan"], "more than 0"),
        (&["--time-limit", "inf"], "more than 0"),
        (&["--time-limit", "soon"], "not a number of seconds"),
        (&["--node-limit", "0"], "at least 1"),
        (&["--node-limit", "-3"], "not a whole number"),
        (&["--memory-budget", "garbage"], "not a byte count"),
        (&["--memory-budget", "0"], "at least 1 byte"),
        (&["--dim", "N=0"], "between 1 and 2^48"),
        (&["--dim", "N=99999999999999999999"], "not a positive integer"),
        (&["--dim", "N"], "NAME=VALUE"),
    ];
    for (args, text) in cases {
        for cmd in ["optimize", "explain"] {
            let mut all = vec![cmd, p.as_str()];
            all.extend_from_slice(args);
            fails(&eqfuse(&all), 2, text);
        }
    }
    fails(&eqfuse(&["optimize", &p, "--format", "bogus"]), 2, "invalid value");
    fails(&eqfuse(&["bench", &p, "--repeat", "0"]), 2, "at least 1");
    fails(&eqfuse(&["export", &p, "--dim", "N=0"]), 2, "between 1 and 2^48");
}

#[test]
fn dims_twice_or_unknown_are_usage_errors() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    for cmd in ["optimize", "export", "codegen", "run"] {
        let mut args = vec![cmd, p.as_str(), "--dim", "N=8", "--dim", "N=16"];
        if cmd == "codegen" {
            args.extend(["-o", "unused"]);
        }
        fails(&eqfuse(&args), 2, "--dim N is given twice (N=8 and N=16)");
        let args = [cmd, p.as_str(), "--dim", "Q=8", "-o", "unused"];
        let args = if cmd == "codegen" { &args[..] } else { &args[..4] };
        fails(&eqfuse(args), 2, "declares no dim `Q` (it declares N)");
    }
    // A JSON graph has fixed shapes, from a file or from standard input.
    let json = stdout(&eqfuse(&["export", &p]));
    let g = d.path().join("g.json");
    std::fs::write(&g, &json).unwrap();
    fails(&eqfuse(&["optimize", g.to_str().unwrap(), "--dim", "N=4"]), 2, "a JSON graph has fixed shapes");
    fails(&eqfuse_in(&["optimize", "-", "--dim", "N=4"], Some(&json)), 2, "a JSON graph has fixed shapes");
}

#[test]
fn good_options_plan() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    let o = eqfuse(&["optimize", &p, "--time-limit", "0.5", "--node-limit", "1", "--memory-budget", "1MiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("fused:   1 kernel, "), "{out}");
    assert!(out.contains("unfused: 2 kernels, "), "{out}");
}

/// A profile JSON: h100's with `edit` applied.
fn profile(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/profiles/h100.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    p.display().to_string()
}

#[test]
fn device_profiles_are_validated_on_load() {
    use serde_json::json;
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("max_args", Box::new(|v| v["max_kernel_args"] = json!(0)), "max_kernel_args is 0"),
        ("max_args2", Box::new(|v| v["max_kernel_args"] = json!(2)), "must be at least 12"),
        ("bw", Box::new(|v| v["copy_bandwidth_gbs"] = json!(0.0)), "copy_bandwidth_gbs must be a positive number"),
        ("launch", Box::new(|v| v["launch_overhead_us"] = json!(-1.0)), "launch_overhead_us must be a non-negative"),
        ("sm", Box::new(|v| v["sm_count"] = json!(0)), "sm_count must be at least 1"),
        ("l2", Box::new(|v| v["l2_bandwidth_gbs"] = json!(0.0)), "l2_bandwidth_gbs must be a positive number"),
        ("reuse", Box::new(|v| v["l2_reuse_bytes"] = json!(1u64 << 40)), "l2_reuse_bytes"),
        (
            "reuse_limit",
            Box::new(|v| {
                v["l2_reuse_bytes"] = json!(1u64 << 24);
                v["l2_reuse_limit_bytes"] = json!(1u64 << 23)
            }),
            "l2_reuse_limit_bytes (8388608) must exceed l2_reuse_bytes (16777216)",
        ),
        (
            "eff",
            Box::new(|v| v["templates"]["rowreduce"]["bandwidth_efficiency"] = json!(0.0)),
            "templates.rowreduce.bandwidth_efficiency must be a positive number, got 0",
        ),
        (
            "eff_neg",
            Box::new(|v| v["templates"]["elementwise"]["bandwidth_efficiency"] = json!(-0.5)),
            "templates.elementwise.bandwidth_efficiency",
        ),
        (
            "flops",
            Box::new(|v| v["templates"]["gemm"]["implementations"]["cublaslt"]["flops_f32_tflops"] = json!(0)),
            "templates.gemm.implementations.cublaslt.flops_f32_tflops",
        ),
        (
            "tile",
            Box::new(|v| {
                v["templates"]["gemm"]["implementations"]["generated"]["tiles"]["8x64"]["sm_ns_per_k"] = json!(0)
            }),
            "templates.gemm.implementations.generated.tiles.8x64.sm_ns_per_k",
        ),
        (
            "tile_key",
            Box::new(|v| {
                v["templates"]["gemm"]["implementations"]["generated"]["tiles"]["big"] =
                    json!({"lone_ns_per_k": 1.0, "sm_ns_per_k": 1.0})
            }),
            "tile `big`",
        ),
        (
            "sizes",
            Box::new(|v| {
                v["templates"]["gemm"]["implementations"]["cublaslt"]["rate_by_size"]["f32"] =
                    json!([[1.0, 10.0], [1.0, 20.0]])
            }),
            "the sizes must increase",
        ),
        ("schema", Box::new(|v| v["schema"] = json!("eqfuse.profile/9")), "schema is `eqfuse.profile/9`"),
        ("typo", Box::new(|v| v["copy_bandwith_gbs"] = json!(1.0)), "unknown field `copy_bandwith_gbs`"),
        (
            "typo_nested",
            Box::new(|v| v["templates"]["rowreduce"]["stage_latency"] = json!(1.0)),
            "unknown field `stage_latency`",
        ),
        (
            "template",
            Box::new(|v| v["templates"]["softmax"] = v["templates"]["rowreduce"].clone()),
            "unknown template `softmax`",
        ),
        (
            "missing",
            Box::new(|v| {
                v["templates"].as_object_mut().unwrap().remove("colreduce");
            }),
            "no rates for template `colreduce`",
        ),
        (
            "implementation",
            Box::new(|v| v["templates"]["gemm"]["implementations"]["cublas"] = v["templates"]["rowreduce"].clone()),
            "unknown implementation `cublas`",
        ),
    ];
    for (name, edit, text) in cases {
        let file = profile(d.path(), &format!("{name}.json"), edit);
        let o = eqfuse(&["optimize", &p, "--device", &file]);
        fails(&o, 1, text);
        assert!(stderr(&o).contains(&file), "{name}: the message names the file:\n{}", stderr(&o));
    }
    // Field errors the JSON parser finds carry their line and column.
    let file = profile(d.path(), "typo2.json", |v| v["copy_bandwith_gbs"] = json!(1.0));
    let o = eqfuse(&["optimize", &p, "--device", &file]);
    assert!(stderr(&o).starts_with(&format!("error: {file}:")), "{}", stderr(&o));
    fails(&eqfuse(&["optimize", &p, "--device", "h300"]), 2, "unknown device `h300`: give h100, h200");
    // The shipped profiles load.
    for dev in ["h100", "h200", "profiles/h100.json", "profiles/h200.json"] {
        let o = eqfuse(&["optimize", &p, "--device", dev]);
        assert!(o.status.success(), "{dev}: {}", stderr(&o));
        let out = stdout(&o);
        assert!(!out.contains("NaN") && !out.contains("inf"), "{out}");
    }
}

#[test]
fn input_files_that_are_not_files_are_errors() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    let inputs = d.path().join("in");
    let outputs = d.path().join("out");
    std::fs::create_dir_all(inputs.join("x.npy")).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", p.as_str(), "--cpu", "--outputs", outputs.to_str().unwrap()];
        args.extend_from_slice(extra);
        eqfuse(&args)
    };
    fails(&run(&["--inputs", inputs.to_str().unwrap()]), 1, "input `x` is a folder, not a .npy file");
    std::fs::remove_dir(inputs.join("x.npy")).unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("/dev/zero", inputs.join("x.npy")).unwrap();
        fails(&run(&["--inputs", inputs.to_str().unwrap()]), 1, "input `x` is a device or other special file");
        std::fs::remove_file(inputs.join("x.npy")).unwrap();
        std::os::unix::fs::symlink(d.path().join("nothing"), inputs.join("y.npy")).unwrap();
        fails(&run(&["--inputs", inputs.to_str().unwrap()]), 1, "input `y` is a link to nothing");
        std::fs::remove_file(inputs.join("y.npy")).unwrap();
    }
    assert!(!outputs.exists(), "a failed run wrote {}", outputs.display());
    // The inputs folder: a file, or missing; the outputs folder: a file.
    fails(&run(&["--inputs", &p]), 1, "the inputs folder is a file, not a folder");
    fails(&run(&["--inputs", d.path().join("none").to_str().unwrap()]), 1, "the inputs folder does not exist");
    fails(&eqfuse(&["run", &p, "--cpu", "--outputs", &p]), 1, "the outputs folder is a file, not a folder");
    // On the GPU path too, before anything is planned or opened.
    fails(&eqfuse(&["run", &p, "--inputs", &p]), 1, "the inputs folder is a file, not a folder");
    // A good run writes everything, and repeats from its own folder.
    let o = run(&["--inputs", inputs.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["x.npy", "y.npy", "out.npy"] {
        assert!(outputs.join(f).is_file(), "{f}");
    }
    let again =
        eqfuse(&["run", &p, "--cpu", "--inputs", outputs.to_str().unwrap(), "--outputs", outputs.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stdout(&again).contains("loaded from"), "{}", stdout(&again));
}

#[test]
fn files_written_at_the_end_are_checked_first() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    let dir = d.path().to_str().unwrap();
    let missing = d.path().join("none").join("x.json");
    // Before any GPU work (these would otherwise exit 3 on a machine without one).
    fails(&eqfuse(&["bench", &p, "--json", dir]), 1, "is a folder; give the name of a file");
    fails(&eqfuse(&["bench", &p, "--json", missing.to_str().unwrap()]), 1, "does not exist");
    fails(&eqfuse(&["calibrate", "-o", dir]), 1, "is a folder; give the name of a file");
}

#[cfg(unix)]
#[test]
fn programs_and_profiles_that_are_not_files_are_errors() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    // /dev/zero never ends: reading it would hang, so it is refused before reading.
    fails(&eqfuse(&["optimize", &p, "--device", "/dev/zero"]), 1, "/dev/zero: is a device or other special file");
    fails(&eqfuse(&["optimize", &p, "--device", "examples"]), 1, "examples: is a folder");
    let zero = d.path().join("zero.eqf");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    fails(&eqfuse(&["optimize", zero.to_str().unwrap()]), 1, "is a device or other special file");
    let bad = d.path().join("bad.eqf");
    std::fs::write(&bad, b"\xff\xfe").unwrap();
    fails(&eqfuse(&["optimize", bad.to_str().unwrap()]), 1, "not UTF-8 text");
}

#[test]
fn a_failed_run_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    let outputs = d.path().join("out");
    // A folder where the output file goes: found before any file is written.
    std::fs::create_dir_all(outputs.join("out.npy")).unwrap();
    let o = eqfuse(&["run", &p, "--cpu", "--outputs", outputs.to_str().unwrap()]);
    fails(&o, 1, "a folder is in the way");
    let left: Vec<PathBuf> = std::fs::read_dir(&outputs).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(left, vec![outputs.join("out.npy")], "the failed run left files behind");
}

#[test]
fn options_a_command_cannot_honour_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    let out = d.path().join("out");
    let out = out.to_str().unwrap();
    for flag in [
        &["--device", "h200"][..],
        &["--rules", "rules"],
        &["--memory-budget", "1GB"],
        &["--strict"],
        &["--no-fusion"],
        &["--extractor", "ilp"],
        &["--node-limit", "5"],
        &["--time-limit", "1"],
        &["--repeat", "3"],
        &["--graph"],
    ] {
        let mut args = vec!["run", p.as_str(), "--cpu", "--outputs", out];
        args.extend_from_slice(flag);
        fails(&eqfuse(&args), 2, "cannot be used with");
    }
    fails(&eqfuse(&["run", &p, "--repeat", "0", "--graph"]), 2, "--graph times the graph's replays");
    // What --cpu does take.
    let o = eqfuse(&["run", &p, "--cpu", "--outputs", out, "--seed", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn without_a_gpu_run_suggests_cpu() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    let out = d.path().join("out");
    let o = eqfuse(&["run", &p, "--outputs", out.to_str().unwrap(), "--repeat", "1"]);
    if o.status.code() == Some(3) {
        fails(&o, 3, "`eqfuse run --cpu`");
    }
}

#[test]
fn standard_input_takes_eqf_and_json() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    let json = stdout(&eqfuse(&["export", &p]));
    for text in [SMALL.to_string(), json.clone(), format!("\n  {json}")] {
        let o = eqfuse_in(&["optimize", "-", "--format", "json"], Some(&text));
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stdout(&o).contains("\"kernels\""), "{}", stdout(&o));
    }
    // A bad JSON graph on standard input is reported as JSON, with its place.
    let o = eqfuse_in(&["optimize", "-"], Some("{\"schema\": 3}"));
    fails(&o, 1, "<stdin>");
}

#[test]
fn codegen_replaces_its_own_files_and_refuses_other_folders() {
    let d = tempfile::tempdir().unwrap();
    let p = small(d.path());
    let out = d.path().join("gen");
    let o = eqfuse(&["codegen", "examples/layernorm.eqf", "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("wrote 1 kernel source, "), "{}", stdout(&o));
    let first: Vec<String> = cu_files(&out);
    assert_eq!(first.len(), 1);
    // A second codegen of another program leaves only its own kernels.
    let o = eqfuse(&["codegen", &p, "--dim", "N=16", "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("removed 1 stale .cu file"), "{}", stdout(&o));
    let second = cu_files(&out);
    assert_eq!(second.len(), 1);
    assert!(second.iter().all(|f| !first.contains(f)) || first == second, "{first:?} {second:?}");
    // A folder with other files is refused, and left alone.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    fails(&eqfuse(&["codegen", &p, "-o", out.to_str().unwrap()]), 1, "holds `notes.txt`");
    assert_eq!(cu_files(&out), second);
    fails(&eqfuse(&["codegen", &p, "-o", &p]), 1, "-o names a file");
}

fn cu_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    v.sort();
    v
}

#[test]
fn summaries_read_well() {
    let d = tempfile::tempdir().unwrap();
    // A kernel writing two outputs computed side by side shows both in its body.
    let two = d.path().join("two.eqf");
    std::fs::write(&two, "dim N = 64\ninput x: f32[N]\na = exp(x)\nb = log(x)\noutput a\noutput b\n").unwrap();
    let o = eqfuse(&["optimize", two.to_str().unwrap(), "--format", "json"]);
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let k = &plan["kernels"][0];
    assert_eq!(k["writes"], serde_json::json!(["a", "b"]));
    assert_eq!(k["body"], "a = (exp x); b = (log x)");
    let text = stdout(&eqfuse(&["optimize", two.to_str().unwrap(), "--format", "text"]));
    assert!(text.contains("body   a = (exp x); b = (log x)"), "{text}");
    assert!(text.contains("fused:   1 kernel, "), "{text}");
    // A program with nothing to compute: no -0.0, no NaN.
    let id = d.path().join("id.eqf");
    std::fs::write(&id, "dim N = 4\ninput x: f32[N]\ny = x * 1\noutput y\n").unwrap();
    let text = stdout(&eqfuse(&["optimize", id.to_str().unwrap()]));
    assert!(text.contains("fused:   0 kernels, 0 B, 0.0 us predicted"), "{text}");
    assert!(!text.contains("-0.0") && !text.contains("NaN"), "{text}");
    let json = stdout(&eqfuse(&["optimize", id.to_str().unwrap(), "--format", "json"]));
    assert!(!json.contains("-0.0"), "{json}");
    // An output with no finite value says so, with no NaN minimum, maximum or mean.
    let nan = d.path().join("nan.eqf");
    std::fs::write(&nan, "dim N = 4\ninput x: f32[N]\ny = log(x * 0 - 1)\noutput y\n").unwrap();
    let out = d.path().join("out");
    let o = eqfuse(&["run", nan.to_str().unwrap(), "--cpu", "--outputs", out.to_str().unwrap()]);
    let text = stdout(&o);
    assert!(text.contains("no finite value, 4 NaN") && !text.contains("mean NaN"), "{text}");
}

/// Every profile committed (shipped, and those recorded beside bench results) passes the
/// validation a profile gets on load.
#[test]
fn every_committed_profile_is_valid() {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, found);
            } else if p.extension().is_some_and(|x| x == "json")
                && std::fs::read_to_string(&p).is_ok_and(|t| t.contains("\"eqfuse.profile/1\""))
            {
                found.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = vec![];
    walk(&root.join("profiles"), &mut found);
    walk(&root.join("benches"), &mut found);
    assert!(found.len() >= 2);
    for p in &found {
        let loaded = eqfuse::DeviceProfile::load(p.to_str().unwrap());
        assert!(loaded.is_ok(), "{}: {}", p.display(), loaded.unwrap_err());
    }
}

/// `explain` of a plan whose search a deadline cut (saturation stopped mid-way) explains what
/// the e-graph holds and never panics.
#[test]
fn explain_after_a_cut_search_does_not_panic() {
    let prog = "tests/cases/fuzz_cli/4d74cd64398c0bd4/prog.json";
    for limit in ["0.0001", "0.002"] {
        let o = eqfuse(&["explain", prog, "--node-limit", "500", "--time-limit", limit]);
        assert_eq!(o.status.code(), Some(0), "--time-limit {limit}: {}", stderr(&o));
        assert!(stdout(&o).contains("time-limit"), "--time-limit {limit}: {}", stdout(&o));
    }
}

/// A program whose dropout seed is an i32 input plans, and runs on the CPU with the seed
/// generated like any other i32 input or read from `--inputs`; a seed of the wrong dtype or
/// shape is an error naming it.
#[test]
fn dropout_seed_given_as_an_input() {
    let case = "tests/cases/ok/dropout_seed_input.eqf";
    let o = eqfuse(&["optimize", case]);
    assert!(o.status.success() && stdout(&o).contains("x, bias, s"), "{}{}", stdout(&o), stderr(&o));
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    let out = out.to_str().unwrap();
    let o = eqfuse(&["run", case, "--cpu", "--outputs", out]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(d.path().join("out/s.npy").exists() && d.path().join("out/y.npy").exists());
    let o = eqfuse(&["run", case, "--cpu", "--inputs", out, "--outputs", out]);
    assert!(o.status.success(), "{}", stderr(&o));
    for (decl, text) in [("f32[]", "got dtype f32"), ("i32[2]", "must have shape [] or [1], got [2]")] {
        let p = d.path().join("bad.eqf");
        std::fs::write(&p, format!("input x: f32[4]\ninput s: {decl}\ny = dropout(x, 0.1, s)\noutput y\n")).unwrap();
        fails(&eqfuse(&["run", p.to_str().unwrap(), "--cpu", "--outputs", out]), 1, text);
    }
}
