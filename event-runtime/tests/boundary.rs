//! The store boundary, checked on the source: what DESIGN.md ("A third store backend") counts
//! is kept true by this test, so that a new backend keeps touching the files it says and no
//! more. It reads `event-runtime/src`; code lines only (comments and doc lines are skipped).

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, as paths relative to `src/` with `/` separators.
fn sources(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            out.push((rel, fs::read_to_string(&path).unwrap()));
        }
    }
}

fn all_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    sources(&root, &root, &mut out);
    assert!(
        out.len() > 100,
        "expected the crate's sources, found {}",
        out.len()
    );
    out
}

/// The lines of `text` that are code: not `//` comments or doc lines.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
}

/// The files (and first line) where a code line contains one of `needles`.
fn files_naming(needles: &[&str], skip: impl Fn(&str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for (file, text) in all_sources() {
        if skip(&file) {
            continue;
        }
        if let Some((line, _)) =
            code_lines(&text).find(|(_, l)| needles.iter().any(|n| l.contains(n)))
        {
            found.push(format!("{file}:{line}"));
        }
    }
    found
}

fn file_names(found: &[String]) -> Vec<&str> {
    found.iter().map(|f| f.split(':').next().unwrap()).collect()
}

#[test]
fn only_the_store_writes_sql_against_the_outbox_tables() {
    let verbs = [
        "FROM event_",
        "INTO event_",
        "UPDATE event_",
        "JOIN event_",
        "TABLE event_",
    ];
    // The conformance suite's fixtures are a test's SQL (a trigger, a lock, an operator's
    // hand-edit), given by the backend under test.
    let found = files_naming(&verbs, |f| {
        f.starts_with("store/") || f.starts_with("testing/conformance/")
    });
    assert!(
        found.is_empty(),
        "SQL against the outbox tables outside store/: {found:?}"
    );
}

#[test]
fn only_the_backend_modules_name_a_database_type() {
    let types = [
        "SqliteDialect",
        "PostgresDialect",
        "SqlitePool",
        "PgPool",
        "sqlx::Sqlite,",
        "sqlx::Postgres,",
        "sqlx::Sqlite;",
        "sqlx::Postgres;",
    ];
    let found = files_naming(&types, |f| {
        f == "store/sqlite.rs" || f == "store/postgres.rs"
    });
    assert!(
        found.is_empty(),
        "a database's types outside its backend module: {found:?}"
    );
}

#[test]
fn a_backend_feature_is_named_in_the_counted_places_only() {
    let features = ["feature = \"sqlite\"", "feature = \"postgres\""];
    let found = files_naming(&features, |f| {
        f == "store/sqlite.rs" || f == "store/postgres.rs"
    });
    // `store/mod.rs`: the module list and `BACKENDS`, where a new backend adds its lines.
    // `store/sql/claim.rs`: portable statements only the SQLite dialect uses today (the claim
    // in steps of a single-writer database), allowed to be dead without it.
    assert_eq!(
        file_names(&found),
        ["store/mod.rs", "store/sql/claim.rs"],
        "DESIGN.md counts these places; update both together: {found:?}"
    );
}
