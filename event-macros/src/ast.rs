//! The macros' model of their input (an event type, a handler function), built from syn's
//! tree with the attributes parsed. Reports only shapes it cannot model; rules are in `check`.

use quote::quote;
use syn::{Data, DeriveInput, Fields, FnArg, Generics, Ident, ItemFn, PatType, Path, Type};

use crate::attr::{self, EventAttrs, HandlerAttrs};
use crate::ctxt::Ctxt;

/// An input of `#[derive(DomainEvent)]`.
pub(crate) struct Event<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) generics: &'a Generics,
    pub(crate) attrs: EventAttrs,
    /// `true` for a struct with named fields, the only shape an event can have.
    pub(crate) named: bool,
    pub(crate) fields: Vec<Field<'a>>,
    /// `#[serde(rename_all = "…")]` on the struct.
    pub(crate) rename_all: attr::SerdeName,
}

pub(crate) struct Field<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) ty: &'a Type,
    /// The `aggregate_id` key of `#[event(aggregate_id)]`, when the field has it.
    pub(crate) aggregate_id: Option<Path>,
    /// The `sensitive` key of `#[event(sensitive)]`, when the field has it.
    pub(crate) sensitive: Option<Path>,
    /// `#[serde(rename = "…")]` on the field, or a form of it the derive cannot follow.
    pub(crate) serde: attr::SerdeName,
}

const SHAPE: &str = "domain events must be structs with named fields";

impl<'a> Event<'a> {
    pub(crate) fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Self {
        let attrs = attr::event_attrs(cx, &input.attrs);
        let mut fields = Vec::new();
        let mut named = false;
        match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named_fields) => {
                    named = true;
                    for field in &named_fields.named {
                        let keys = attr::field_attrs(cx, &field.attrs);
                        if let Some(ident) = &field.ident {
                            fields.push(Field {
                                ident,
                                ty: &field.ty,
                                aggregate_id: keys.aggregate_id,
                                sensitive: keys.sensitive,
                                serde: attr::serde_name(&field.attrs, "rename"),
                            });
                        }
                    }
                }
                Fields::Unnamed(unnamed) => cx.error_spanned_by(
                    unnamed,
                    format_args!(
                        "{SHAPE}, not tuple structs: name the fields, \
                         `struct {} {{ order_id: String, … }}`",
                        input.ident
                    ),
                ),
                Fields::Unit => {
                    let (struct_token, ident) = (&data.struct_token, &input.ident);
                    cx.error_spanned_by(
                        quote!(#struct_token #ident),
                        format_args!(
                            "{SHAPE}, not unit structs: an event carries at least the id of its \
                             aggregate, `struct {ident} {{ #[event(aggregate_id)] id: String }}`"
                        ),
                    );
                }
            },
            Data::Enum(data) => cx.error_spanned_by(
                data.enum_token,
                format_args!(
                    "{SHAPE}, not enums: declare one struct per event, each with its own \
                     `#[event(name = \"…\")]`; for one handler of several events, hold them in \
                     an enum with `#[derive(EventUnion)]`"
                ),
            ),
            Data::Union(data) => {
                cx.error_spanned_by(data.union_token, format_args!("{SHAPE}, not unions"))
            }
        }
        Event {
            ident: &input.ident,
            generics: &input.generics,
            attrs,
            named,
            fields,
            rename_all: attr::serde_name(&input.attrs, "rename_all"),
        }
    }
}

/// An input of `#[event_handler]`.
pub(crate) struct Handler<'a> {
    pub(crate) item: &'a ItemFn,
    pub(crate) attrs: HandlerAttrs,
    /// The typed parameters, in order (a `self` receiver is reported and left out).
    pub(crate) params: Vec<&'a PatType>,
}

impl<'a> Handler<'a> {
    pub(crate) fn from_ast(cx: &Ctxt, item: &'a ItemFn, attrs: HandlerAttrs) -> Self {
        let mut params = Vec::new();
        for input in &item.sig.inputs {
            match input {
                FnArg::Typed(param) => params.push(param),
                FnArg::Receiver(receiver) => cx.error_spanned_by(
                    receiver,
                    "event handlers must be free functions, not methods: `self` cannot be \
                     provided by the runtime; move the handler out of the `impl` block and \
                     take what it needs as `&T` resources",
                ),
            }
        }
        Handler {
            item,
            attrs,
            params,
        }
    }
}
