//! Runs the schema compatibility fixtures: every `tests/fixtures/compat/<family>/<case>/` is
//! checked under each mode its `expected.json` names; fixtures hold the rules, not this file.
//!
//! A case folder holds exactly three files:
//!
//! * `old.json` and `new.json`: the two JSON Schemas given to `check_schema` (the event is
//!   always `order.placed v1`), or two catalogs, arrays of `CatalogEntry` given to
//!   `check_catalog` (a JSON Schema is never an array). Schemas derived from Rust types were
//!   written by `schemars` and are kept as data, so the cases do not move with its output.
//! * `expected.json`:
//!
//! ```json
//! {
//!   "about": "what the case shows, and the Rust types the schemas come from",
//!   "overrides": { "order.placed": "NONE" },
//!   "expect": {
//!     "BACKWARD": [ { "rule": "RequiredFieldAdded", "path": "currency", "contains": ["absent"] } ],
//!     "FORWARD": [],
//!     "FULL": [ { "direction": "BACKWARD", "rule": "RequiredFieldAdded", "path": "currency" } ]
//!   }
//! }
//! ```
//!
//! `expect` maps each mode checked to the violations expected, in the order reported; `[]`
//! means compatible. A violation names its `rule` and `path` (`""` for the root); `direction`
//! is implied under BACKWARD and FORWARD and required under FULL. Optional: `message` (the
//! exact text), `contains` (substrings of it), `display` (the exact one-line `Display`) and
//! `event` (catalogs). `overrides` (catalogs only) maps event names to modes. Every violation
//! of every check must also display on one line naming its event, field and rule.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use event_runtime::schema::{
    check_catalog, check_schema, CatalogEntry, Compatibility, Direction, Rule, Violation,
};
use serde::Deserialize;
use serde_json::Value;

/// The event name `check_schema` is given for every schema case.
const EVENT: &str = "order.placed v1";

/// The files of a case folder, sorted.
const FILES: [&str; 3] = ["expected.json", "new.json", "old.json"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expected {
    about: String,
    #[serde(default)]
    overrides: HashMap<String, Compatibility>,
    expect: BTreeMap<String, Vec<ExpectedViolation>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectedViolation {
    event: Option<String>,
    direction: Option<Direction>,
    rule: Rule,
    path: String,
    message: Option<String>,
    #[serde(default)]
    contains: Vec<String>,
    display: Option<String>,
}

#[test]
fn every_compat_fixture_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/compat");
    let cases = match find_cases(&root) {
        Ok(cases) => cases,
        Err(e) => panic!("{}: {e}", root.display()),
    };
    assert!(
        !cases.is_empty(),
        "no fixture case under {}: the runner would pass without checking anything",
        root.display()
    );
    let mut failures = Vec::new();
    let mut checks = 0;
    for (name, dir) in &cases {
        match run_case(dir) {
            Ok(n) => checks += n,
            Err(e) => failures.push(format!("--- {name}\n{e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} compat fixture cases failed:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("{} compat fixture cases, {checks} checks", cases.len());
}

/// The case folders, two levels down (`<family>/<case>`), sorted, each named `family/case`.
fn find_cases(root: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let mut cases = Vec::new();
    for family in sorted_entries(root)? {
        for case in sorted_entries(&family)? {
            let name = format!("{}/{}", file_name(&family), file_name(&case));
            let files: Vec<String> = sorted_entries(&case)?
                .iter()
                .map(|p| file_name(p))
                .collect();
            if files != FILES {
                return Err(format!(
                    "{name} holds {files:?}, expected exactly {FILES:?}"
                ));
            }
            cases.push((name, case));
        }
    }
    Ok(cases)
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let read = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = read
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    out.sort();
    Ok(out)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file_name(path)))
}

/// Checks one case under each mode it names; returns how many modes were checked.
fn run_case(dir: &Path) -> Result<usize, String> {
    let old: Value = read_json(&dir.join("old.json"))?;
    let new: Value = read_json(&dir.join("new.json"))?;
    let expected: Expected = read_json(&dir.join("expected.json"))?;
    if expected.expect.is_empty() {
        return Err("expected.json names no mode under `expect`".to_owned());
    }
    let catalogs = match (old.is_array(), new.is_array()) {
        (true, true) => {
            let parse = |v: Value, file: &str| {
                serde_json::from_value::<Vec<CatalogEntry>>(v).map_err(|e| format!("{file}: {e}"))
            };
            Some((
                parse(old.clone(), "old.json")?,
                parse(new.clone(), "new.json")?,
            ))
        }
        (false, false) if expected.overrides.is_empty() => None,
        (false, false) => return Err("`overrides` only applies to catalogs".to_owned()),
        _ => return Err("old.json and new.json must both be schemas or both catalogs".to_owned()),
    };
    let mut errors = Vec::new();
    for (mode_name, want) in &expected.expect {
        let mode: Compatibility = match mode_name.parse() {
            Ok(mode) => mode,
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        let got = match &catalogs {
            Some((old, new)) => check_catalog(old, new, mode, &expected.overrides),
            None => check_schema(EVENT, &old, &new, mode),
        };
        let mut problems = check_display(&got);
        match compare(mode, want, &got) {
            Ok(mut p) => problems.append(&mut p),
            Err(e) => problems.push(format!("  {e}")),
        }
        if !problems.is_empty() {
            errors.push(format!("{mode}:\n{}", problems.join("\n")));
        }
    }
    if errors.is_empty() {
        Ok(expected.expect.len())
    } else {
        Err(format!("({})\n{}", expected.about, errors.join("\n")))
    }
}

/// Every violation displays on one line that names its event, field and rule.
fn check_display(got: &[Violation]) -> Vec<String> {
    let mut problems = Vec::new();
    for v in got {
        let line = v.to_string();
        let head = if v.field.is_empty() {
            format!("{}: root: ", v.event)
        } else {
            format!("{}: field `{}`: ", v.event, v.field)
        };
        if line.contains('\n') || !line.starts_with(&head) || !line.contains(v.rule.as_str()) {
            problems.push(format!(
                "  display is not one line naming event, field and rule: {line:?}"
            ));
        }
    }
    problems
}

/// The differences between the violations expected and those reported, one line each; an
/// error when the expectation itself is malformed.
fn compare(
    mode: Compatibility,
    want: &[ExpectedViolation],
    got: &[Violation],
) -> Result<Vec<String>, String> {
    let implied = match mode {
        Compatibility::Backward => Some(Direction::Backward),
        Compatibility::Forward => Some(Direction::Forward),
        Compatibility::Full | Compatibility::None => None,
    };
    let mut directions = Vec::new();
    for w in want {
        match w.direction.or(implied) {
            Some(d) => directions.push(d),
            None => return Err(format!("give the `direction` of `{}` {}", w.path, w.rule)),
        }
    }
    let same = |i: usize, v: &Violation| {
        let w = &want[i];
        directions[i] == v.direction
            && w.rule == v.rule
            && w.path == v.field
            && w.event.as_ref().is_none_or(|e| *e == v.event)
    };
    if want.len() != got.len() || !got.iter().enumerate().all(|(i, v)| same(i, v)) {
        return Ok(diff(want, &directions, got, same));
    }
    let mut problems = Vec::new();
    for (w, v) in want.iter().zip(got) {
        let at = format!("  {} {} at `{}`", v.direction, v.rule, v.field);
        if let Some(message) = &w.message {
            if *message != v.message {
                problems.push(format!(
                    "{at}: message\n    - {message}\n    + {}",
                    v.message
                ));
            }
        }
        for part in &w.contains {
            if !v.message.contains(part.as_str()) {
                problems.push(format!("{at}: message lacks {part:?}\n    + {}", v.message));
            }
        }
        if let Some(display) = &w.display {
            let line = v.to_string();
            if *display != line {
                problems.push(format!("{at}: display\n    - {display}\n    + {line}"));
            }
        }
    }
    Ok(problems)
}

/// A line diff (longest common subsequence) of the expected and reported violations:
/// `-` expected only, `+` reported only.
fn diff(
    want: &[ExpectedViolation],
    directions: &[Direction],
    got: &[Violation],
    same: impl Fn(usize, &Violation) -> bool,
) -> Vec<String> {
    let (n, m) = (want.len(), got.len());
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if same(i, &got[j]) {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let show_want = |i: usize| {
        let w = &want[i];
        let event = w
            .event
            .as_ref()
            .map(|e| format!("{e}: "))
            .unwrap_or_default();
        format!("{event}{} {} at `{}`", directions[i], w.rule, w.path)
    };
    let show_got = |v: &Violation| {
        format!(
            "{}: {} {} at `{}`: {}",
            v.event, v.direction, v.rule, v.field, v.message
        )
    };
    let mut out = vec!["  (- expected, + reported)".to_owned()];
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && same(i, &got[j]) {
            out.push(format!("    {}", show_got(&got[j])));
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push(format!("  + {}", show_got(&got[j])));
            j += 1;
        } else {
            out.push(format!("  - {}", show_want(i)));
            i += 1;
        }
    }
    out
}
