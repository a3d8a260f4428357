//! The README's first example is real: the program it shows is `examples/layernorm.eqf`, and the
//! output it shows is what `eqfuse optimize examples/layernorm.eqf` prints, timings aside
//! (`saturate 14.0 ms, extract 2.1 ms` vary from run to run and are masked on both sides).

use std::process::Command;

/// The `text` code blocks of the README, in order.
fn text_blocks(readme: &str) -> Vec<String> {
    let mut blocks = vec![];
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```text") => current = Some(String::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap_or_default()),
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// Every `NUMBER ms` becomes `_ ms`.
fn mask_timings(text: &str) -> String {
    let words: Vec<&str> = text.split(' ').collect();
    let mut out: Vec<&str> = Vec::with_capacity(words.len());
    for (i, w) in words.iter().enumerate() {
        let next_is_ms = words.get(i + 1).is_some_and(|n| n.starts_with("ms"));
        out.push(if next_is_ms && w.parse::<f64>().is_ok() { "_" } else { w });
    }
    out.join(" ")
}

#[test]
fn the_readme_shows_the_example_and_what_optimize_prints() {
    let readme = std::fs::read_to_string("README.md").expect("README.md");
    let blocks = text_blocks(&readme);
    let program = std::fs::read_to_string("examples/layernorm.eqf").expect("example");
    let shown = blocks.iter().position(|b| b == &program).expect("the README shows examples/layernorm.eqf as it is");
    let printed = &blocks[shown + 1];
    let out = Command::new(env!("CARGO_BIN_EXE_eqfuse"))
        .args(["optimize", "examples/layernorm.eqf"])
        .env("NO_COLOR", "1")
        .output()
        .expect("eqfuse runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let real = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(
        mask_timings(printed),
        mask_timings(&real),
        "the README's output of `eqfuse optimize examples/layernorm.eqf` is stale: paste the real one"
    );
}

#[test]
fn timings_are_masked_and_nothing_else() {
    assert_eq!(mask_timings("saturate 14.0 ms, extract 2.1 ms (x)"), "saturate _ ms, extract _ ms (x)");
    assert_eq!(mask_timings("15.4 us predicted, 3 ms"), "15.4 us predicted, _ ms");
}
