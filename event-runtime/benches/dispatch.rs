//! `cargo bench -p event-runtime --bench dispatch`: the cost of typed dispatch against a direct
//! call and against a naive `TypeId` map bus, all in one run (see BENCHMARKS.md). Before the
//! timings it prints the heap allocations per dispatch of every case, counted by the global
//! allocator below.
//!
//! `cargo bench -p event-runtime --bench dispatch -- --instructions` instead runs each case
//! under `valgrind --tool=callgrind`, N and 2N times after the same warm-up, and prints the
//! instructions per dispatch, `(Ir(2N) − Ir(N)) / N`: a figure that does not depend on the
//! machine's load. `--instructions typed typed_guarded` limits it to some cases.

use std::alloc::{GlobalAlloc, Layout, System};
use std::any::{Any, TypeId};
use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use criterion::{BenchmarkGroup, Criterion};
use event_core::{event_handler, DomainEvent, Envelope};
use event_runtime::Dispatcher;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Counts this thread's allocations (a thread-local, so that counting costs no atomic).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "bench.happened", version = 1)]
struct Happened {
    #[event(aggregate_id)]
    id: u64,
    amount: u64,
}

#[derive(Default)]
struct Total(AtomicU64);

#[event_handler]
fn add(event: &Happened, total: &Total) {
    total.0.fetch_add(event.amount, Ordering::Relaxed);
}

/// An event with four plain-`fn` handlers.
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "bench.counted", version = 1)]
struct Counted {
    #[event(aggregate_id)]
    id: u64,
    amount: u64,
}

#[event_handler]
fn add_1(event: &Counted, total: &Total) {
    total.0.fetch_add(event.amount, Ordering::Relaxed);
}

#[event_handler]
fn add_2(event: &Counted, total: &Total) {
    total.0.fetch_add(event.amount, Ordering::Relaxed);
}

#[event_handler]
fn add_3(event: &Counted, total: &Total) {
    total.0.fetch_add(event.amount, Ordering::Relaxed);
}

#[event_handler]
fn add_4(event: &Counted, total: &Total) {
    total.0.fetch_add(event.amount, Ordering::Relaxed);
}

/// Polls a future that completes without waiting (every handler here is sync). Inlined, so
/// that the future is polled where it is built, as in an `async fn`, rather than first moved
/// into this function's frame.
#[inline(always)]
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("sync handlers complete on the first poll"),
    }
}

fn dispatcher(guard: usize, total: Arc<Total>) -> Dispatcher {
    Dispatcher::builder_empty()
        .handler::<add>()
        .resource_arc(total)
        .idempotency_capacity(guard)
        .build()
        .expect("valid registry")
}

/// Distinct event ids the dispatch cases cycle through: more than the guard holds, so that
/// every guarded dispatch admits a pair the guard has forgotten.
const IDS: usize = 1 << 14;

type Bus = HashMap<TypeId, Vec<Box<dyn Fn(&dyn Any)>>>;

/// Runs one case: times it, counts its allocations, or loops it for callgrind.
trait Runner {
    fn run<R>(&mut self, name: &'static str, f: impl FnMut() -> R);
}

/// Every case, each defined once for all runners.
///
/// A dispatch case looks at its report where it was made (`black_box(&report)`), as a caller
/// does, rather than returning it: moving the 64-byte value out of the closure into
/// criterion's `black_box` costs a store-forwarding stall of the harness's own, which
/// `typed_moved_out` shows.
fn cases(r: &mut impl Runner) {
    let mut envelope = Envelope::new(Happened { id: 1, amount: 3 });
    let total = Arc::new(Total::default());

    r.run("direct_call", || {
        add(black_box(envelope.event()), black_box(&total))
    });

    let plain = dispatcher(0, Arc::clone(&total));
    // Fresh event ids, made before the run: an id computed and stored (two 8-byte stores)
    // right before the dispatch reads it (one 16-byte load) stalls on store forwarding, a
    // cost of the harness's own that a decoded envelope does not have.
    let ids: Vec<Uuid> = (1..=IDS as u128).map(Uuid::from_u128).collect();
    let mut n = 0usize;
    r.run("typed", || {
        n += 1;
        envelope.metadata_mut().id = ids[n % IDS];
        let report = ready(plain.dispatch(black_box(&envelope)));
        black_box(&report);
    });

    // The same, returning the report to criterion: what moving it out costs the harness.
    r.run("typed_moved_out", || {
        n += 1;
        envelope.metadata_mut().id = ids[n % IDS];
        ready(plain.dispatch(black_box(&envelope)))
    });

    let guarded = dispatcher(event_runtime::DEFAULT_GUARD_CAPACITY, Arc::clone(&total));
    r.run("typed_guarded", || {
        n += 1;
        envelope.metadata_mut().id = ids[n % IDS];
        let report = ready(guarded.dispatch(black_box(&envelope)));
        black_box(&report);
    });

    let mut bus: Bus = HashMap::new();
    let t = Arc::clone(&total);
    bus.entry(TypeId::of::<Happened>())
        .or_default()
        .push(Box::new(move |e: &dyn Any| {
            if let Some(e) = e.downcast_ref::<Happened>() {
                add(e, &t)
            }
        }));
    r.run("typeid_map_baseline", || {
        let event: &Happened = black_box(envelope.event());
        if let Some(handlers) = bus.get(&event.type_id()) {
            for h in handlers {
                h(event);
            }
        }
    });

    let mut counted = Envelope::new(Counted { id: 1, amount: 3 });
    r.run("four_direct_calls", || {
        let (event, total) = (black_box(counted.event()), black_box(&total));
        add_1(event, total);
        add_2(event, total);
        add_3(event, total);
        add_4(event, total);
    });

    let four = Dispatcher::builder_empty()
        .handler::<add_1>()
        .handler::<add_2>()
        .handler::<add_3>()
        .handler::<add_4>()
        .resource_arc(Arc::clone(&total))
        .idempotency_capacity(0)
        .build()
        .expect("valid registry");
    r.run("typed_4_handlers", || {
        n += 1;
        counted.metadata_mut().id = ids[n % IDS];
        let report = ready(four.dispatch(black_box(&counted)));
        black_box(&report);
    });

    // The same CloudEvents text, decoded by hand into the type and handled, or dispatched.
    let json = serde_json::to_string(&envelope).expect("serialises");
    r.run("json_baseline", || {
        let decoded: Envelope<Happened> = serde_json::from_str(black_box(&json)).expect("decodes");
        add(decoded.event(), &total)
    });

    r.run("dispatch_json", || {
        let report = ready(plain.dispatch_json(black_box(&json))).expect("decodes");
        black_box(&report);
    });

    // The same, validated against the event's JSON Schema first (`validate_schemas`).
    let validated = Dispatcher::builder_empty()
        .handler::<add>()
        .resource_arc(Arc::clone(&total))
        .idempotency_capacity(0)
        .validate_schemas(true)
        .build()
        .expect("valid registry");
    r.run("dispatch_json_validated", || {
        let report = ready(validated.dispatch_json(black_box(&json))).expect("valid");
        black_box(&report);
    });

    black_box(total.0.load(Ordering::Relaxed));
}

struct Timed<'a>(BenchmarkGroup<'a, criterion::measurement::WallTime>);

impl Runner for Timed<'_> {
    fn run<R>(&mut self, name: &'static str, mut f: impl FnMut() -> R) {
        self.0.bench_function(name, |b| b.iter(&mut f));
    }
}

/// Allocations per call over many calls, after a warm-up longer than the guard's capacity
/// (though the guard allocates nothing as it fills either).
struct Allocations;

impl Runner for Allocations {
    fn run<R>(&mut self, name: &'static str, mut f: impl FnMut() -> R) {
        const WARM_UP: u64 = event_runtime::DEFAULT_GUARD_CAPACITY as u64 + 1_000;
        const CALLS: u64 = 50_000;
        for _ in 0..WARM_UP {
            black_box(f());
        }
        let before = allocations();
        for _ in 0..CALLS {
            black_box(f());
        }
        let per_call = (allocations() - before) as f64 / CALLS as f64;
        println!("{name:<22} allocations per dispatch: {per_call}");
    }
}

/// Runs one case `calls` times after `warm_up` calls (in a process under callgrind).
struct Loop {
    case: String,
    warm_up: u64,
    calls: u64,
}

impl Runner for Loop {
    fn run<R>(&mut self, name: &'static str, mut f: impl FnMut() -> R) {
        if name != self.case {
            return;
        }
        for _ in 0..self.warm_up + self.calls {
            black_box(f());
        }
    }
}

/// The names of every case, in order.
struct Names(Vec<&'static str>);

impl Runner for Names {
    fn run<R>(&mut self, name: &'static str, _: impl FnMut() -> R) {
        self.0.push(name);
    }
}

const CHILD: &str = "EVENTS_DISPATCH_CALLGRIND_CASE";

fn instructions(only: &[String]) {
    let exe = std::env::current_exe().expect("the bench's own path");
    let mut names = Names(Vec::new());
    cases(&mut names);
    println!("instructions per dispatch (valgrind --tool=callgrind, (Ir(2N) - Ir(N)) / N):");
    for name in names.0 {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        // Decoding JSON costs thousands of instructions: fewer calls suffice.
        let calls: u64 = if name.contains("json") {
            5_000
        } else {
            100_000
        };
        let ir = |n: u64| -> u64 {
            let out = std::env::temp_dir().join(format!("dispatch-callgrind-{name}-{n}.out"));
            let status = Command::new("valgrind")
                .args(["--tool=callgrind", "--quiet"])
                .arg(format!("--callgrind-out-file={}", out.display()))
                .arg(&exe)
                .env(CHILD, format!("{name} {n}"))
                .status()
                .expect("valgrind runs (is it installed?)");
            assert!(status.success(), "valgrind failed on {name}");
            let text = std::fs::read_to_string(&out).expect("callgrind output");
            let _ = std::fs::remove_file(&out);
            text.lines()
                .find_map(|l| l.strip_prefix("summary: ").or(l.strip_prefix("totals: ")))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .expect("a summary line")
        };
        let (once, twice) = (ir(calls), ir(2 * calls));
        let per_call = (twice - once) as f64 / calls as f64;
        println!("{name:<22} {per_call:>10.1} instructions  (N = {calls})");
    }
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        let (case, calls) = spec.split_once(' ').expect("`case calls`");
        cases(&mut Loop {
            case: case.to_owned(),
            warm_up: event_runtime::DEFAULT_GUARD_CAPACITY as u64 + 1_000,
            calls: calls.parse().expect("a number of calls"),
        });
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--instructions") {
        let only: Vec<String> = args[i + 1..]
            .iter()
            .filter(|a| !a.starts_with("--"))
            .cloned()
            .collect();
        instructions(&only);
        return;
    }
    cases(&mut Allocations);
    let mut criterion = Criterion::default().configure_from_args();
    {
        let mut timed = Timed(criterion.benchmark_group("dispatch"));
        cases(&mut timed);
        timed.0.finish();
    }
    criterion.final_summary();
}
