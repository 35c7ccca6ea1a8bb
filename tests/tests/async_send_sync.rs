//! Every public handle is `Send + Sync` and every public future is `Send`, so that they can be
//! shared between tasks and spawned on a multi-threaded runtime (as tokio's own
//! `tests/async_send_sync.rs` checks). The checks are compile-time: this file failing to build
//! is the failure.

#![allow(dead_code, clippy::let_underscore_future)]

use std::time::Duration;

use event_runtime::transport::nats::{NatsInbox, NatsRelay, ReceivedBatch};
use event_runtime::{
    CancellationToken, Dispatcher, Outbox, OutboxConfig, OutboxUnitOfWork, Store, Tx, Workers,
};

fn send<T: Send>(_: &T) {}
fn send_sync<T: Send + Sync>() {}

#[test]
fn handles_are_send_and_sync() {
    send_sync::<Store>();
    send_sync::<Outbox>();
    send_sync::<OutboxConfig>();
    send_sync::<Dispatcher>();
    send_sync::<Workers>();
    send_sync::<NatsRelay>();
    send_sync::<NatsInbox>();
    send_sync::<event_runtime::StoreError>();
    send_sync::<event_runtime::OutboxError>();
    send_sync::<event_runtime::transport::nats::NatsError>();
}

#[test]
fn a_transaction_and_a_unit_of_work_are_send() {
    fn is_send<T: Send>() {}
    is_send::<Tx>();
    is_send::<OutboxUnitOfWork<'static>>();
    is_send::<ReceivedBatch>();
}

/// Never run: it only has to compile.
async fn futures_are_send(store: Store, outbox: Outbox, inbox: NatsInbox, workers: Workers) {
    send(&Store::connect("sqlite::memory:"));
    send(&store.begin());
    send(&store.stats());
    send(&store.dead_letters(&Default::default()));
    send(&outbox.begin());
    send(&outbox.deliver_batch());
    send(&outbox.drain(Duration::ZERO));
    send(&outbox.purge_expired());
    let uow = outbox.begin().await.unwrap();
    send(&uow.commit());
    let mut tx = store.begin().await.unwrap();
    send(&tx.execute("SELECT 1", &[]));
    send(&tx.query("SELECT 1").fetch_all());
    send(&tx.commit());
    send(&inbox.fetch_and_commit());
    send(&inbox.receive());
    send(&inbox.verify());
    send(&inbox.run(CancellationToken::new(), None));
    let batch = inbox.fetch_and_commit().await.unwrap();
    send(&batch.ack());
    send(&workers.wait());
    send(&workers.shutdown(Duration::ZERO));
    send(&event_runtime::transport::nats::connect(
        "nats://127.0.0.1:4222",
        "app",
    ));
}
