//! `docs/language.md` is the `.eqf` language's specification: every `eqf` block in it parses
//! (and each `# -> NAME: TYPE` line in one names an output and its type), every `eqf-error`
//! block fails with the place and message its first line states (`# error: LINE:COL: text`,
//! as in `tests/cases/err`), and every operator of the op table is listed.

use std::fs;

use eqfuse::{parse_program, Error, OPS};

const DOC: &str = "docs/language.md";

/// The fenced blocks of a markdown text: (language tag, first line number, body).
fn blocks(text: &str) -> Vec<(String, usize, String)> {
    let mut out = vec![];
    let mut open: Option<(String, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(tag)) => open = Some((tag.trim().to_string(), i + 1, String::new())),
            (Some(_), Some("")) => out.extend(open.take()),
            (Some((_, _, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{DOC}: a code block is not closed");
    out
}

#[test]
fn every_example_parses_with_the_stated_types() {
    let text = fs::read_to_string(DOC).unwrap();
    let mut checked = 0;
    let mut failures = vec![];
    for (tag, line, body) in blocks(&text).into_iter().filter(|b| b.0 == "eqf") {
        let name = format!("{DOC}:{line}");
        let p = match parse_program(&name, &body, &[]) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name} ({tag}): {e}"));
                continue;
            }
        };
        for claim in body.lines().filter_map(|l| l.strip_prefix("# -> ")) {
            let (out, ty) = claim.split_once(':').expect("`# -> NAME: TYPE`");
            let want: String = ty.chars().filter(|c| !c.is_whitespace()).collect();
            let got = p.outputs.iter().find(|o| o.name == out.trim()).and_then(|o| p.ty(o.id)).map(|t| t.to_string());
            if got.as_deref() != Some(want.as_str()) {
                failures.push(format!("{name}: `{}` is {got:?}, the text says {want}", out.trim()));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 30, "only {checked} type claims found in {DOC}");
}

#[test]
fn every_error_example_fails_as_stated() {
    let text = fs::read_to_string(DOC).unwrap();
    let mut failures = vec![];
    let cases: Vec<_> = blocks(&text).into_iter().filter(|b| b.0 == "eqf-error").collect();
    for (_, line, body) in &cases {
        let name = format!("{DOC}:{line}");
        let stated = body.lines().next().and_then(|l| l.strip_prefix("# error: ")).expect("`# error: L:C: text`");
        let (place, message) = stated.split_once(": ").expect("`L:C: text`");
        let (l, c) = place.split_once(':').expect("`L:C`");
        let want = (l.parse::<usize>().unwrap(), c.parse::<usize>().unwrap());
        match parse_program(&name, body, &[]) {
            Ok(_) => failures.push(format!("{name}: parsed, the text says it fails")),
            Err(Error::Input(d)) if (d.line, d.col) == want && d.message == message => {}
            Err(e) => failures.push(format!("{name}: expected {place}: {message}\ngot: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cases.len() >= 10, "only {} error examples found in {DOC}", cases.len());
}

/// A name as a call is spelt (the op table's named operators; the rest are symbols).
fn is_identifier(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Each operator appears in inline code outside the examples: a named one as a call
/// (`exp(x)`), a symbol between operands (`a + b`).
#[test]
fn every_operator_is_listed() {
    let text = fs::read_to_string(DOC).unwrap();
    let mut prose = String::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_block = !in_block;
        } else if !in_block {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    let spans: Vec<&str> = prose.split('`').skip(1).step_by(2).collect();
    let called = |name: &str| {
        spans.iter().any(|s| {
            s.match_indices(&format!("{name}("))
                .any(|(i, _)| !s[..i].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_'))
        })
    };
    let missing: Vec<&str> = OPS
        .iter()
        .map(|o| o.name)
        .filter(|&n| if is_identifier(n) { !called(n) } else { !spans.iter().any(|s| s.contains(&format!(" {n} "))) })
        .collect();
    assert!(missing.is_empty(), "operators not listed in {DOC}: {missing:?}");
}
