//! A NATS relay added to an outbox that already holds events never publishes those (nothing
//! writes their deliveries later): `NatsRelay::unpublished_before` counts them, and
//! `NatsRelay::check` warns, until the relay has a delivery of its own. Against the real NATS
//! server (`EVENTS_TEST_NATS_URL`) and both stores.

mod common;

use std::time::Duration;

use event_core::{DomainEvent, Envelope};
use event_runtime::transport::nats::{NatsRelay, RelayConfig, StreamSpec};
use event_runtime::{Dispatcher, Outbox, Store};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "latetest.placed", version = 1)]
struct Placed {
    #[event(aggregate_id)]
    order: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "latetest.audited", version = 1)]
struct Audited {
    #[event(aggregate_id)]
    order: String,
}

async fn commit(outbox: &Outbox, orders: &[&str]) {
    let mut uow = outbox.begin().await.unwrap();
    for o in orders {
        uow.add(Envelope::new(Placed {
            order: (*o).to_owned(),
        }));
        uow.add(Envelope::new(Audited {
            order: (*o).to_owned(),
        }));
    }
    uow.commit().await.unwrap();
}

fn dispatcher() -> event_runtime::DispatcherBuilder {
    Dispatcher::builder_empty()
        .event::<Placed>()
        .event::<Audited>()
}

async fn a_relay_added_late_counts_what_it_never_publishes(store: Store, label: &str) {
    let url = match std::env::var("EVENTS_TEST_NATS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            common::say_once(
                "NATS",
                "NATS cases skipped: EVENTS_TEST_NATS_URL is not set",
            );
            return;
        }
    };
    let client = async_nats::connect(&url).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let id = uuid::Uuid::now_v7().simple().to_string();
    let (stream, prefix) = (format!("L{id}"), format!("l{id}"));
    StreamSpec::new(&stream)
        .subjects([format!("{prefix}.>")])
        .create(&js)
        .await
        .unwrap();
    let relay_on = |store: Store| {
        // Only `latetest.placed` leaves the service.
        let relay = NatsRelay::new(
            client.clone(),
            RelayConfig::new(&stream)
                .only(["latetest.placed"])
                .subject_prefix(prefix.clone()),
        );
        let outbox = Outbox::builder(store)
            .dispatcher(dispatcher())
            .destination(relay.clone())
            .build()
            .unwrap();
        (relay, outbox)
    };

    // A fresh outbox with the relay: nothing missed.
    let (relay, outbox) = relay_on(store.clone());
    relay.check(&outbox).await.unwrap();
    assert_eq!(
        relay.unpublished_before(&outbox).await.unwrap(),
        0,
        "{label}"
    );

    // Events committed without the relay, then the relay added.
    let without = Outbox::builder(store.clone())
        .dispatcher(dispatcher())
        .build()
        .unwrap();
    commit(&without, &["A", "B", "C"]).await;
    let (relay, outbox) = relay_on(store.clone());
    relay.check(&outbox).await.unwrap();
    assert_eq!(
        relay.unpublished_before(&outbox).await.unwrap(),
        3,
        "{label}: the three events it routes, not the ones it does not"
    );

    // Once it has a delivery of its own (published or not), nothing more is said.
    commit(&outbox, &["D"]).await;
    assert_eq!(
        relay.unpublished_before(&outbox).await.unwrap(),
        0,
        "{label}"
    );
    outbox.drain(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        relay.unpublished_before(&outbox).await.unwrap(),
        0,
        "{label}"
    );
    js.delete_stream(&stream).await.unwrap();
}

#[tokio::test]
async fn a_relay_added_late_counts_what_it_never_publishes_sqlite() {
    let (_, store) = common::sqlite("relay_added_late").await;
    a_relay_added_late_counts_what_it_never_publishes(store, "sqlite").await;
}

#[tokio::test]
async fn a_relay_added_late_counts_what_it_never_publishes_postgres() {
    let Some((_, _, store)) = common::postgres("relay_added_late").await else {
        return;
    };
    a_relay_added_late_counts_what_it_never_publishes(store, "postgres").await;
}
