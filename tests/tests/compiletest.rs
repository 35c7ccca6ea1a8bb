//! UI tests of the macros: every `ui/pass` file compiles, every `ui/fail` file fails with
//! the `.stderr` next to it. Regenerate with `TRYBUILD=overwrite` and read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*/*.rs");
}
