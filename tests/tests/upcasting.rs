//! Versions and upcasting: a handler takes the newest version of its event, and envelopes of
//! older versions are upcast step by step (v1 → v2 → v3) before it runs — through typed
//! dispatch, raw and JSON dispatch, the in-memory unit of work and durable delivery on SQLite
//! and PostgreSQL — and start-up validation refuses broken chains, naming the types.
//!
//! Every registry here is built by hand (`builder_empty`): this binary also declares broken
//! chains on purpose, which `inventory` collects.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{databases, Db};
use event_core::{
    event_handler, AnyEnvelope, DecodeError, DomainEvent, Envelope, EventDescriptor, EventRecorder,
    RawEnvelope, Upcaster,
};
use event_runtime::{Dispatcher, Outbox, Outcome, Registry, RegistryError, SqlValue, Store};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

// ---- one event in three versions ------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 1)]
struct OrderPlacedV1 {
    #[event(aggregate_id)]
    order_id: String,
    amount: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
struct OrderPlacedV2 {
    #[event(aggregate_id)]
    order_id: String,
    amount: u64,
    country: String,
}

/// Orders placed before v2 were all domestic.
impl From<OrderPlacedV1> for OrderPlacedV2 {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlacedV2 {
            order_id: v1.order_id,
            amount: v1.amount,
            country: "United States".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", version = 3, upcast_from = OrderPlacedV2)]
struct OrderPlacedV3 {
    #[event(aggregate_id)]
    order_id: String,
    amount: u64,
    country: String,
    currency: String,
}

impl From<OrderPlacedV2> for OrderPlacedV3 {
    fn from(v2: OrderPlacedV2) -> Self {
        let currency = if v2.country == "Canada" { "CAD" } else { "USD" };
        OrderPlacedV3 {
            order_id: v2.order_id,
            amount: v2.amount,
            country: v2.country,
            currency: currency.into(),
        }
    }
}

/// What the handlers saw: (handler, event id, sequence, payload).
#[derive(Default)]
struct Seen(Mutex<Vec<(&'static str, Uuid, u64, OrderPlacedV3)>>);

impl Seen {
    fn push(&self, handler: &'static str, envelope: &Envelope<OrderPlacedV3>) {
        self.0.lock().unwrap().push((
            handler,
            envelope.id(),
            envelope.sequence(),
            envelope.event().clone(),
        ));
    }
    fn take(&self) -> Vec<(&'static str, Uuid, u64, OrderPlacedV3)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[event_handler(name = "orders.bill")]
fn bill(envelope: &Envelope<OrderPlacedV3>, seen: &Seen) {
    seen.push("bill", envelope);
}

#[event_handler(name = "orders.reserve", in_transaction)]
fn reserve(envelope: &Envelope<OrderPlacedV3>, seen: &Seen) {
    seen.push("reserve", envelope);
}

#[event_handler(name = "orders.notify")]
async fn notify(envelope: &Envelope<OrderPlacedV3>, seen: &Seen) {
    seen.push("notify", envelope);
}

fn v1(id: &str) -> OrderPlacedV1 {
    OrderPlacedV1 {
        order_id: id.into(),
        amount: 1250,
    }
}

fn v2(id: &str, country: &str) -> OrderPlacedV2 {
    OrderPlacedV2 {
        order_id: id.into(),
        amount: 1250,
        country: country.into(),
    }
}

fn v3(id: &str, country: &str, currency: &str) -> OrderPlacedV3 {
    OrderPlacedV3 {
        order_id: id.into(),
        amount: 1250,
        country: country.into(),
        currency: currency.into(),
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn dispatcher() -> Dispatcher {
    Dispatcher::builder_empty()
        .handler::<bill>()
        .handler::<notify>()
        .resource(Seen::default())
        .build()
        .unwrap()
}

fn seen(d: &Dispatcher) -> Vec<(&'static str, Uuid, u64, OrderPlacedV3)> {
    d.resource::<Seen>().unwrap().take()
}

// ---- dispatch -------------------------------------------------------------------------------

#[test]
fn typed_dispatch_of_v1_upcasts_step_by_step_to_the_version_the_handlers_take() {
    let d = dispatcher();
    let envelope = Envelope::new(v1("A-1")).with_sequence(7);
    let report = block_on(d.dispatch(&envelope));
    assert_eq!(report.ran(), 2, "{report:?}");
    assert_eq!(report.event_name(), "order.placed");
    // v1 → v2 (country) → v3 (currency from the country); the metadata is the original's.
    assert_eq!(
        seen(&d),
        vec![
            ("bill", envelope.id(), 7, v3("A-1", "United States", "USD")),
            (
                "notify",
                envelope.id(),
                7,
                v3("A-1", "United States", "USD")
            ),
        ]
    );
}

#[test]
fn typed_dispatch_of_v2_upcasts_one_step_and_of_v3_not_at_all() {
    let d = dispatcher();
    let older = Envelope::new(v2("C-1", "Canada"));
    assert_eq!(block_on(d.dispatch(&older)).ran(), 2);
    let newest = Envelope::new(v3("C-2", "Canada", "CAD"));
    assert_eq!(block_on(d.dispatch(&newest)).ran(), 2);
    let seen: Vec<_> = seen(&d)
        .into_iter()
        .map(|(h, id, _, e)| (h, id, e))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("bill", older.id(), v3("C-1", "Canada", "CAD")),
            ("notify", older.id(), v3("C-1", "Canada", "CAD")),
            ("bill", newest.id(), v3("C-2", "Canada", "CAD")),
            ("notify", newest.id(), v3("C-2", "Canada", "CAD")),
        ]
    );
}

#[test]
fn the_idempotency_guard_keys_an_upcast_envelope_by_its_original_event_id() {
    let d = dispatcher();
    let envelope = Envelope::new(v1("A-1"));
    assert_eq!(block_on(d.dispatch(&envelope)).ran(), 2);
    // The same event again, now as v3 (a producer that was upgraded and re-sent it): the
    // (handler, event id) pairs are the same, so nothing runs twice.
    let again = Envelope::from_parts(
        envelope.metadata().clone(),
        v3("A-1", "United States", "USD"),
    );
    let report = block_on(d.dispatch(&again));
    assert_eq!((report.ran(), report.duplicates()), (0, 2), "{report:?}");
    assert_eq!(seen(&d).len(), 2);
}

#[test]
fn raw_and_json_dispatch_of_a_v1_envelope_upcast_it() {
    let d = dispatcher();
    let envelope = Envelope::new(v1("A-2")).with_sequence(1);
    let json = serde_json::to_string(&envelope).unwrap();
    assert!(json.contains(r#""schemaversion":1"#), "{json}");

    let report = block_on(d.dispatch_json(&json)).unwrap();
    assert_eq!(report.ran(), 2, "{report:?}");
    let raw = RawEnvelope::from_json(&json).unwrap();
    // Dispatched again: the guard skips both.
    assert_eq!(block_on(d.dispatch_raw(&raw)).unwrap().duplicates(), 2);
    let seen = seen(&d);
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|(_, id, _, e)| *id == envelope.id() && e.currency == "USD"));
}

#[test]
fn the_in_memory_unit_of_work_upcasts_for_both_phases() {
    let d = Dispatcher::builder_empty()
        .handler::<bill>()
        .handler::<reserve>()
        .resource(Seen::default())
        .build()
        .unwrap();
    let mut recorder = EventRecorder::new();
    recorder.record(v1("A-3"));
    recorder.record(v2("A-3", "Canada"));
    let ids: Vec<Uuid> = recorder.pending().iter().map(|e| e.metadata().id).collect();
    let mut uow = d.unit_of_work();
    uow.extend(recorder.take());
    let reports = block_on(uow.commit()).unwrap();
    assert!(reports.iter().all(|r| r.ran() == 2), "{reports:?}");
    let seen: Vec<_> = seen(&d)
        .into_iter()
        .map(|(h, id, seq, e)| (h, id, seq, e.currency))
        .collect();
    // In-transaction handlers of every event first, then after-commit ones.
    assert_eq!(
        seen,
        vec![
            ("reserve", ids[0], 1, "USD".to_owned()),
            ("reserve", ids[1], 2, "CAD".to_owned()),
            ("bill", ids[0], 1, "USD".to_owned()),
            ("bill", ids[1], 2, "CAD".to_owned()),
        ]
    );
}

#[test]
fn an_older_version_without_handlers_for_its_newest_version_dispatches_to_nothing() {
    let d = Dispatcher::builder_empty()
        .event::<OrderPlacedV3>()
        .build()
        .unwrap();
    let report = block_on(d.dispatch(&Envelope::new(v1("A-4"))));
    assert!(report.outcomes().is_empty());
}

// ---- the registry -----------------------------------------------------------------------------

#[test]
fn registering_a_version_registers_the_versions_it_upcasts_from() {
    // Only the handler of v3 is named: v2 and v1 come with it, so their envelopes decode.
    let d = dispatcher();
    let registry = d.registry();
    let mut versions: Vec<_> = registry
        .events()
        .iter()
        .map(|e| (e.name, e.version, e.type_name.rsplit("::").next().unwrap()))
        .collect();
    versions.sort_unstable();
    assert_eq!(
        versions,
        vec![
            ("order.placed", 1, "OrderPlacedV1"),
            ("order.placed", 2, "OrderPlacedV2"),
            ("order.placed", 3, "OrderPlacedV3"),
        ]
    );
    assert_eq!(registry.latest_version("order.placed").unwrap().version, 3);
    let v3 = registry.event_by_name("order.placed", 3).unwrap();
    let from = (v3.upcast_from.unwrap().from)();
    assert_eq!((from.name, from.version), ("order.placed", 2));
    assert!(registry
        .event_by_name("order.placed", 1)
        .unwrap()
        .upcast_from
        .is_none());
}

#[test]
fn registry_upcast_and_decode_latest() {
    let d = dispatcher();
    let registry = d.registry();
    let envelope = Envelope::new(v1("A-5")).with_sequence(3);
    let raw = envelope.to_raw().unwrap();

    let decoded = registry.decode(&raw).unwrap();
    assert_eq!(decoded.version(), 1);
    let latest = registry.decode_latest(&raw).unwrap();
    assert_eq!(latest.version(), 3);
    let typed = latest
        .as_any()
        .downcast_ref::<Envelope<OrderPlacedV3>>()
        .unwrap();
    assert_eq!(typed.event(), &v3("A-5", "United States", "USD"));
    assert_eq!(typed.metadata(), envelope.metadata());

    // To an intermediate version.
    let to_v2 = registry
        .upcast(decoded, std::any::TypeId::of::<OrderPlacedV2>())
        .unwrap();
    assert_eq!(to_v2.version(), 2);
    // Already there: returned as it is.
    let same = registry
        .upcast(to_v2, std::any::TypeId::of::<OrderPlacedV2>())
        .unwrap();
    assert_eq!(same.version(), 2);
    // Never downcast.
    let err = registry
        .upcast(latest, std::any::TypeId::of::<OrderPlacedV1>())
        .unwrap_err();
    assert!(
        matches!(
            &err,
            DecodeError::NoUpcastPath {
                version: 3,
                target_version: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("never downcast"), "{err}");
    // Not to another event.
    let other = Box::new(Envelope::new(Misc { id: "m".into() })) as Box<dyn AnyEnvelope>;
    let err = registry
        .upcast(other, std::any::TypeId::of::<OrderPlacedV3>())
        .unwrap_err();
    assert!(err.to_string().contains("not registered"), "{err}");
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "misc.happened")]
struct Misc {
    #[event(aggregate_id)]
    id: String,
}

// ---- start-up validation ----------------------------------------------------------------------

macro_rules! event {
    ($ty:ident, $name:tt, $version:tt $(, $from:ident)?) => {
        #[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
        #[event(name = $name, version = $version $(, upcast_from = $from)?)]
        struct $ty {
            #[event(aggregate_id)]
            id: String,
        }
        $(
            impl From<$from> for $ty {
                fn from(e: $from) -> Self {
                    $ty { id: e.id }
                }
            }
        )?
    };
}

// v3 upcasts from v1 while v2 is registered.
event!(GapV1, "gap.made", 1);
event!(GapV2, "gap.made", 2);
event!(GapV3, "gap.made", 3, GapV1);
// v2 without an upcast from v1.
event!(LooseV1, "loose.made", 1);
event!(LooseV2, "loose.made", 2);
// Two versions upcast from v1.
event!(ForkV1, "fork.made", 1);
event!(ForkV2, "fork.made", 2, ForkV1);
event!(ForkV2b, "fork.made", 3, ForkV1);

#[test]
fn a_chain_that_skips_a_registered_version_is_refused() {
    let err = Registry::builder()
        .event::<GapV2>()
        .event::<GapV3>()
        .build()
        .unwrap_err();
    match &err {
        RegistryError::UpcastGap {
            name,
            version,
            type_name,
            from_version,
            from_type,
            skipped_version,
            skipped_type,
        } => {
            assert_eq!(
                (*name, *version, *from_version, *skipped_version),
                ("gap.made", 3, 1, 2)
            );
            assert!(type_name.ends_with("::GapV3"), "{type_name}");
            assert!(from_type.ends_with("::GapV1"), "{from_type}");
            assert!(skipped_type.ends_with("::GapV2"), "{skipped_type}");
        }
        other => panic!("expected UpcastGap, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("GapV3") && message.contains("skipping v2"),
        "{message}"
    );

    // Without v2 registered, v3 from v1 is a chain without a gap.
    let registry = Registry::builder().event::<GapV3>().build().unwrap();
    assert_eq!(registry.events().len(), 2);
}

#[test]
fn a_version_without_an_upcast_from_the_previous_one_is_refused() {
    let err = Registry::builder()
        .event::<LooseV1>()
        .event::<LooseV2>()
        .build()
        .unwrap_err();
    match &err {
        RegistryError::MissingUpcast {
            name,
            version,
            type_name,
            previous_version,
            previous_type,
        } => {
            assert_eq!((*name, *version, *previous_version), ("loose.made", 2, 1));
            assert!(type_name.ends_with("::LooseV2"), "{type_name}");
            assert!(previous_type.ends_with("::LooseV1"), "{previous_type}");
        }
        other => panic!("expected MissingUpcast, got {other:?}"),
    }
    assert!(err.to_string().contains("upcast_from"), "{err}");
    // Alone, v2 is the lowest version: nothing to upcast from.
    Registry::builder().event::<LooseV2>().build().unwrap();
}

#[test]
fn two_upcasts_from_the_same_version_are_refused() {
    let err = Registry::builder()
        .event::<ForkV2>()
        .event::<ForkV2b>()
        .build()
        .unwrap_err();
    match &err {
        RegistryError::DuplicateUpcast {
            name,
            from_version,
            from_type,
            first_version,
            first,
            second_version,
            second,
        } => {
            assert_eq!(
                (*name, *from_version, *first_version, *second_version),
                ("fork.made", 1, 2, 3)
            );
            assert!(from_type.ends_with("::ForkV1"), "{from_type}");
            assert!(first.ends_with("::ForkV2"), "{first}");
            assert!(second.ends_with("::ForkV2b"), "{second}");
        }
        other => panic!("expected DuplicateUpcast, got {other:?}"),
    }
    assert!(
        err.to_string()
            .contains("upcast `upcasting::ForkV2b` from `upcasting::ForkV2`"),
        "{err}"
    );
}

impl From<Misc> for GapV2 {
    fn from(e: Misc) -> Self {
        GapV2 { id: e.id }
    }
}

#[test]
fn an_upcast_from_another_event_built_by_hand_is_refused() {
    // The derive refuses this at compile time (tests/ui/fail/derive/upcast_other_name.rs);
    // a descriptor built by hand is checked at start-up.
    let mut descriptor = EventDescriptor::of::<GapV2>();
    descriptor.upcast_from = Some(Upcaster::of::<Misc, GapV2>());
    let err = Registry::builder()
        .event_descriptor(descriptor)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::InvalidUpcast {
                from_name: "misc.happened",
                ..
            }
        ),
        "{err:?}"
    );
}

#[event_handler(name = "orders.legacy")]
fn legacy(_: &OrderPlacedV2) {}

#[test]
fn a_handler_of_an_older_version_than_the_newest_is_refused() {
    // It would never see an event recorded as v3: envelopes are not downcast.
    let err = Dispatcher::builder_empty()
        .event::<OrderPlacedV3>()
        .handler::<legacy>()
        .build()
        .unwrap_err();
    match &err {
        RegistryError::HandlerTakesOldVersion {
            handler,
            name,
            version,
            latest_version,
            type_name,
            latest_type,
        } => {
            assert_eq!(
                (*handler, *name, *version, *latest_version),
                ("orders.legacy", "order.placed", 2, 3)
            );
            assert!(type_name.ends_with("::OrderPlacedV2"), "{type_name}");
            assert!(latest_type.ends_with("::OrderPlacedV3"), "{latest_type}");
        }
        other => panic!("expected HandlerTakesOldVersion, got {other:?}"),
    }
    assert!(err.to_string().contains("never downcast"), "{err}");
    // While v2 is the newest registered version, the handler is fine.
    let d = Dispatcher::builder_empty()
        .handler::<legacy>()
        .build()
        .unwrap();
    let report = block_on(d.dispatch(&Envelope::new(v1("A-6"))));
    assert!(report
        .outcomes()
        .iter()
        .all(|o| matches!(o.outcome, Outcome::Ran)));
    assert_eq!(report.ran(), 1);
}

// ---- durable delivery -------------------------------------------------------------------------

/// Before the deploy: the application knows v1 only, and its billing handler takes v1.
#[event_handler(name = "orders.bill")]
fn bill_v1(_: &OrderPlacedV1) {
    panic!("the old code never delivers in these tests");
}

async fn effects(store: &Store) {
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "CREATE TABLE IF NOT EXISTS billed (event_id TEXT NOT NULL, handler TEXT NOT NULL, currency TEXT NOT NULL)",
        &[],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

async fn new_code(db: &Db) -> Outbox {
    let store = db.open().await;
    effects(&store).await;
    Outbox::builder(store)
        .dispatcher(
            Dispatcher::builder_empty()
                .handler::<bill>()
                .handler::<notify>()
                .handler::<reserve>(),
        )
        .resource(Seen::default())
        .build()
        .unwrap()
}

async fn commit(outbox: &Outbox, envelopes: Vec<Box<dyn AnyEnvelope>>) {
    let mut uow = outbox.begin().await.unwrap();
    uow.extend(envelopes);
    uow.commit().await.unwrap();
}

async fn scalar(store: &Store, sql: &'static str, args: &[SqlValue<'_>]) -> i64 {
    let mut tx = store.begin().await.unwrap();
    let n = tx.fetch_i64(sql, args).await.unwrap().unwrap_or(-1);
    tx.commit().await.unwrap();
    n
}

#[test]
fn durable_delivery_of_v1_and_v2_events_upcasts_them_for_the_handlers_of_v3() {
    block_on(async {
        for db in databases("upcast_durable").await {
            let outbox = new_code(&db).await;
            let a = Envelope::new(v1("A-7")).with_sequence(1);
            let b = Envelope::new(v2("A-7", "Canada")).with_sequence(2);
            let (ida, idb) = (a.id(), b.id());
            commit(&outbox, vec![Box::new(a), Box::new(b)]).await;
            let seen = outbox.dispatcher().resource::<Seen>().unwrap();
            // The in-transaction handler of v3 ran inside the commit.
            let in_tx: Vec<_> = seen.take().into_iter().map(|(h, id, ..)| (h, id)).collect();
            assert_eq!(
                in_tx,
                vec![("reserve", ida), ("reserve", idb)],
                "{}",
                db.label()
            );

            // The outbox keeps each event as recorded; deliveries go to the v3 handlers.
            let store = outbox.store();
            for (id, version) in [(ida, 1), (idb, 2)] {
                let id = id.to_string();
                let args = [SqlValue::Text(&id)];
                assert_eq!(
                    scalar(
                        store,
                        "SELECT version FROM event_outbox WHERE event_id = $1",
                        &args
                    )
                    .await,
                    version
                );
                assert_eq!(
                    scalar(
                        store,
                        "SELECT COUNT(*) FROM event_deliveries WHERE event_id = $1",
                        &args
                    )
                    .await,
                    2,
                    "{}: one delivery per after-commit handler of v3",
                    db.label()
                );
            }

            let report = outbox.drain(Duration::from_secs(10)).await.unwrap();
            assert_eq!(
                (report.completed, report.dead_lettered),
                (4, 0),
                "{}",
                db.label()
            );
            let mut delivered: Vec<_> = seen
                .take()
                .into_iter()
                .map(|(h, id, seq, e)| (h, id, seq, e.currency))
                .collect();
            delivered.sort();
            let mut expected = vec![
                ("bill", ida, 1, "USD".to_owned()),
                ("bill", idb, 2, "CAD".to_owned()),
                ("notify", ida, 1, "USD".to_owned()),
                ("notify", idb, 2, "CAD".to_owned()),
            ];
            expected.sort();
            assert_eq!(delivered, expected, "{}", db.label());
        }
    });
}

#[test]
fn deliveries_recorded_by_code_that_knew_v1_only_are_upcast_by_code_that_knows_v3() {
    block_on(async {
        for db in databases("upcast_deploy").await {
            // Before the deploy: v1 events committed, deliveries pending for `orders.bill`.
            let store = db.open().await;
            let old = Outbox::builder(store)
                .dispatcher(Dispatcher::builder_empty().handler::<bill_v1>())
                .build()
                .unwrap();
            let mut recorder = EventRecorder::new();
            recorder.record(v1("A-8"));
            recorder.record(v1("A-8"));
            let ids: Vec<Uuid> = recorder.pending().iter().map(|e| e.metadata().id).collect();
            commit(&old, recorder.take()).await;
            drop(old);

            // After: the same handler name now takes v3.
            let new = new_code(&db).await;
            let report = new.drain(Duration::from_secs(10)).await.unwrap();
            assert_eq!(
                (report.completed, report.dead_lettered),
                (2, 0),
                "{}",
                db.label()
            );
            let seen = new.dispatcher().resource::<Seen>().unwrap().take();
            assert_eq!(
                seen,
                vec![
                    ("bill", ids[0], 1, v3("A-8", "United States", "USD")),
                    ("bill", ids[1], 2, v3("A-8", "United States", "USD")),
                ],
                "{}",
                db.label()
            );
        }
    });
}
