//! UI tests of the macros: every `ui/pass` file compiles, every `ui/fail` file fails with
//! the `.stderr` next to it. Regenerate with `TRYBUILD=overwrite` and read the diff.
//!
//! The `.stderr` files are rustc's own words, which change between releases: they are pinned
//! to the toolchain CI has, stable 1.95 (as thiserror's `compiletest.rs` pins its own). On
//! another toolchain the test is ignored, and says so, rather than failing on wording;
//! `cargo test -- --ignored` runs it anyway. Moving the pin is a change of this line and of
//! the `.stderr` files regenerated on the new toolchain, in one commit.

#[rustversion::attr(
    not(stable(1.95)),
    ignore = "the UI tests' .stderr files are pinned to stable 1.95 (tests/tests/compiletest.rs)"
)]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*/*.rs");
}
