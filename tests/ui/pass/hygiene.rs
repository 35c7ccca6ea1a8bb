// The generated code names everything through `event_core::__private`: user items that
// shadow the prelude and the builtin macros do not change what it means.
#![allow(dead_code, unused_macros)]

use event_core::{event_handler, DomainEvent, Handler};
use serde::{Deserialize, Serialize};

struct Result;
struct Ok;
struct Some;
struct None;
struct Box;
struct Option;
struct String;
struct Send;
struct Sync;
struct Fn;

macro_rules! concat {
    ($($t:tt)*) => {
        "shadowed concat"
    };
}
macro_rules! module_path {
    () => {
        "shadowed module_path"
    };
}
macro_rules! line {
    () => {
        0
    };
}
macro_rules! file {
    () => {
        "shadowed file"
    };
}

mod inventory {}
mod serde_json {}
mod _event_core {}

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "hygiene.checked")]
struct Checked {
    #[event(aggregate_id)]
    id: u64,
}

#[derive(Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "hygiene.upcast")]
struct UpcastV1 {
    #[event(aggregate_id)]
    id: u64,
}

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "hygiene.upcast", version = 2, upcast_from = UpcastV1, deny_unknown_fields)]
struct UpcastV2 {
    #[event(aggregate_id)]
    id: u64,
}

impl From<UpcastV1> for UpcastV2 {
    fn from(v1: UpcastV1) -> Self {
        UpcastV2 { id: v1.id }
    }
}

pub struct Db;

#[event_handler]
fn sync_handler(_event: &Checked, _db: &Db) {}

#[event_handler(in_transaction)]
async fn async_handler(_event: &Checked, _tx: &mut Db) -> core::result::Result<(), std::io::Error> {
    core::result::Result::Ok(())
}

// The constants that prove a handler is a free function are named after it: one handler's
// names are not another's (`handler` and `free_handler`, `handler_check`).
#[event_handler]
fn handler(_event: &Checked) {}

#[event_handler]
fn free_handler(_event: &Checked) {}

#[event_handler]
fn handler_check(_event: &Checked) {}

fn main() {
    let d = <sync_handler as Handler>::DESCRIPTOR;
    assert!(d.name.ends_with("::sync_handler"), "{}", d.name);
    assert!(d.file.ends_with("hygiene.rs"), "{}", d.file);
    assert_ne!(d.line, 0);
    let _ = <async_handler as Handler>::DESCRIPTOR;
}
