use std::io;

use event_core::{event_handler, DomainEvent, Envelope, Handler, HandlerCall, HandlerContext, HandlerError};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "payment.failed")]
struct PaymentFailed {
    #[event(aggregate_id)]
    payment_id: String,
}

#[event_handler]
fn unit(_event: &PaymentFailed) {}

#[event_handler]
fn explicit_unit(_event: &PaymentFailed) -> () {}

#[event_handler]
fn permanent(_event: &PaymentFailed) -> Result<(), HandlerError> {
    Err(HandlerError::permanent_msg("card declined"))
}

#[event_handler]
fn io_error(_event: &PaymentFailed) -> Result<(), io::Error> {
    Err(io::Error::new(io::ErrorKind::TimedOut, "gateway timed out"))
}

#[event_handler]
async fn async_io_error(_event: &PaymentFailed) -> Result<(), std::io::Error> {
    Ok(())
}

// A return type that cannot be named in a `const` is converted in place.
#[event_handler]
fn opaque(_event: &PaymentFailed) -> impl event_core::IntoHandlerResult {}

fn call(d: &event_core::HandlerDescriptor, envelope: &Envelope<PaymentFailed>) -> Result<(), HandlerError> {
    let mut ctx = HandlerContext::new(envelope, &[], None);
    match d.call {
        HandlerCall::Sync(call) => call(&mut ctx),
        HandlerCall::Async(_) => unreachable!(),
    }
}

fn main() {
    let envelope = Envelope::new(PaymentFailed { payment_id: "P-1".into() });
    assert!(call(<unit as Handler>::DESCRIPTOR, &envelope).is_ok());
    assert!(call(<explicit_unit as Handler>::DESCRIPTOR, &envelope).is_ok());
    assert!(call(<permanent as Handler>::DESCRIPTOR, &envelope).unwrap_err().is_permanent());
    let error = call(<io_error as Handler>::DESCRIPTOR, &envelope).unwrap_err();
    assert!(error.is_transient());
    assert_eq!(error.chain(), ["gateway timed out"]);
    assert!(call(<opaque as Handler>::DESCRIPTOR, &envelope).is_ok());
    assert!(matches!(<async_io_error as Handler>::DESCRIPTOR.call, HandlerCall::Async(_)));
}
