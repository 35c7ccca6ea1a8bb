//! Implementation detail of `event-core` (placeholder while the macros are written).
use proc_macro::TokenStream;

#[proc_macro_derive(DomainEvent, attributes(event))]
pub fn derive_domain_event(_input: TokenStream) -> TokenStream {
    TokenStream::new()
}

#[proc_macro_attribute]
pub fn event_handler(_args: TokenStream, input: TokenStream) -> TokenStream {
    input
}
