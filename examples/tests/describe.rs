//! The examples' AsyncAPI documents and flows against their committed copies
//! (`examples/orders.asyncapi.json`, `examples/billing.asyncapi.json`, `examples/*.flow.mmd`),
//! and the README's picture against the two flows. `tests/tests/topology.rs` validates the
//! documents with the official AsyncAPI parser.
//!
//! After a change to the events, handlers or routes, write them again and review the diff:
//!
//! ```text
//! EVENTS_CATALOG=bless cargo test -p examples --test describe
//! git diff examples/ README.md
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use event_runtime::schema::BLESS_VAR;
use examples::orders::{self, Args};

fn blessing() -> bool {
    std::env::var(BLESS_VAR).is_ok_and(|v| v == "bless")
}

fn committed(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

fn require() -> bool {
    std::env::var("EVENTS_TEST_REQUIRE_SERVICES").as_deref() == Ok("1")
}

/// `orders events ARGS…` in this process: exit code, standard output, standard error.
fn orders_events(args: &[&str]) -> (ExitCode, String, String) {
    let registry = orders::registry().unwrap();
    let topology = orders::topology(&Args::default());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let argv = std::iter::once("events").chain(args.iter().copied());
    let code = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(event_runtime::cli::run_with_output(
            argv,
            orders::cli_app(&registry, &topology),
            &mut out,
            &mut err,
        ));
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// The `billing` example built by this `cargo test` run, or `None` after saying why not
/// (failing with `EVENTS_TEST_REQUIRE_SERVICES=1`).
fn billing_binary(test: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe
        .parent()?
        .parent()?
        .join("examples")
        .join(format!("billing{}", std::env::consts::EXE_SUFFIX));
    if bin.exists() {
        return Some(bin);
    }
    let why = "the billing example is not built (`cargo test -p examples` builds it; \
               `--test describe` alone does not: run `cargo build -p examples --examples` first)";
    assert!(!require(), "{test}: {why}");
    eprintln!("{test}: skipped: {why}");
    None
}

/// `billing events ARGS…`: success, standard output, standard error.
fn billing_events(bin: &Path, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(bin).arg("events").args(args).output().unwrap();
    (
        output.status.success(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn the_orders_documents_match_their_committed_copies() {
    for (command, file) in [
        ("asyncapi", "orders.asyncapi.json"),
        ("flow", "orders.flow.mmd"),
    ] {
        let path = committed(file);
        if blessing() {
            let (code, out, err) = orders_events(&[command]);
            assert_eq!(code, ExitCode::SUCCESS, "{err}");
            std::fs::write(&path, out).unwrap();
            continue;
        }
        let (code, out, err) = orders_events(&[command, "--check", path.to_str().unwrap()]);
        assert_eq!(
            code,
            ExitCode::SUCCESS,
            "{err}\n(to write it again: {BLESS_VAR}=bless cargo test -p examples --test describe)"
        );
        assert!(out.starts_with("ok: "), "{out}");
    }
}

#[test]
fn the_billing_documents_match_their_committed_copies() {
    let Some(bin) = billing_binary("billing_documents") else {
        return;
    };
    for (command, file) in [
        ("asyncapi", "billing.asyncapi.json"),
        ("flow", "billing.flow.mmd"),
    ] {
        let path = committed(file);
        if blessing() {
            let (ok, out, err) = billing_events(&bin, &[command]);
            assert!(ok, "{err}");
            std::fs::write(&path, out).unwrap();
            continue;
        }
        let (ok, out, err) = billing_events(&bin, &[command, "--check", path.to_str().unwrap()]);
        assert!(
            ok,
            "{err}\n(to write it again: {BLESS_VAR}=bless cargo test -p examples --test describe)"
        );
        assert!(out.starts_with("ok: "), "{out}");
    }
}

/// The README's picture: the orders flow, then billing's without its first line, joined on
/// the subjects the relay publishes to and the inbox reads.
#[test]
fn the_readme_picture_is_the_orders_flow_then_billings() {
    // Blessing, the flows as generated now (the other tests may be rewriting the files).
    let (orders, billing) = if blessing() {
        let Some(bin) = billing_binary("readme_picture") else {
            return;
        };
        (
            orders_events(&["flow"]).1,
            billing_events(&bin, &["flow"]).1,
        )
    } else {
        (
            std::fs::read_to_string(committed("orders.flow.mmd")).unwrap(),
            std::fs::read_to_string(committed("billing.flow.mmd")).unwrap(),
        )
    };
    let picture = format!(
        "{orders}{}",
        billing.split_once('\n').map_or("", |(_, rest)| rest)
    );
    let subject = orders
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("orders_relay_nats_EVENTS --> ")
                .filter(|s| s.starts_with("subject_events_order_shipped_"))
        })
        .expect("no relay edge to events.order.shipped in the orders flow");
    assert!(
        billing.contains(&format!("{subject} --> billing_inbox_billing")),
        "the two flows do not meet on {subject}"
    );
    let readme_path = committed("../README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let start = readme
        .find("```mermaid\n")
        .expect("no mermaid block in the README")
        + 11;
    let end = start + readme[start..].find("```").unwrap();
    if blessing() {
        let updated = format!("{}{picture}{}", &readme[..start], &readme[end..]);
        std::fs::write(&readme_path, updated).unwrap();
        return;
    }
    assert_eq!(
        &readme[start..end],
        picture,
        "the README's picture is stale (to write it again: {BLESS_VAR}=bless cargo test -p \
         examples --test describe)"
    );
}
