//! `#[derive(EventUnion)]`: the enum's variants as parsed, the rules on their shape, and the
//! generated `HandlerEvent`/`EventUnion` impls. Checks needing the variants' events (domain
//! event, `Clone`, one aggregate, no event twice) are left to the compiler, spanned per variant.

use std::collections::HashMap;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::{Data, DeriveInput, Fields, Ident, Path, Type};

use crate::attr::crate_path_value;
use crate::check::tokens_text;
use crate::ctxt::Ctxt;
use crate::expand::use_facade;

const SHAPE: &str = "each variant of an event union holds one domain event: \
                     `Placed(OrderPlaced)`";

struct Variant<'a> {
    ident: &'a Ident,
    ty: &'a Type,
}

pub(crate) fn derive_event_union(input: &DeriveInput) -> syn::Result<TokenStream> {
    let cx = Ctxt::new();
    let crate_path = union_attrs(&cx, input);
    let ident = &input.ident;
    let mut variants = Vec::new();
    match &input.data {
        Data::Enum(data) => {
            if data.variants.is_empty() {
                cx.error_spanned_by(
                    quote!(#ident),
                    "an event union needs at least one variant, each holding one domain event: \
                     `enum OrderEvent { Placed(OrderPlaced), Shipped(OrderShipped) }`",
                );
            }
            let mut seen: HashMap<String, &Ident> = HashMap::new();
            for v in &data.variants {
                let ty = match &v.fields {
                    Fields::Unnamed(f) if f.unnamed.len() == 1 => &f.unnamed[0].ty,
                    Fields::Unnamed(f) => {
                        cx.error_spanned_by(
                            f,
                            format_args!("{SHAPE}; `{}` holds {} fields", v.ident, f.unnamed.len()),
                        );
                        continue;
                    }
                    Fields::Named(f) => {
                        cx.error_spanned_by(
                            f,
                            format_args!(
                                "{SHAPE}, in a tuple variant: move these fields into an event \
                                 struct and write `{}(ThatEvent)`",
                                v.ident
                            ),
                        );
                        continue;
                    }
                    Fields::Unit => {
                        cx.error_spanned_by(
                            &v.ident,
                            format_args!(
                                "{SHAPE}; `{}` holds none: write `{}(ThatEvent)`",
                                v.ident, v.ident
                            ),
                        );
                        continue;
                    }
                };
                let text = tokens_text(ty);
                if let Some(first) = seen.get(&text) {
                    cx.error_spanned_by(
                        ty,
                        format_args!(
                            "`{text}` is held by two variants, `{first}` and `{}`: each event \
                             type is one variant of the union, so that a handler sees it once",
                            v.ident
                        ),
                    );
                    continue;
                }
                seen.insert(text, &v.ident);
                variants.push(Variant {
                    ident: &v.ident,
                    ty,
                });
            }
        }
        Data::Struct(data) => cx.error_spanned_by(
            {
                let token = data.struct_token;
                quote!(#token #ident)
            },
            "`#[derive(EventUnion)]` goes on an enum whose variants each hold one domain event; \
             a struct is one event: `#[derive(DomainEvent)]`",
        ),
        Data::Union(data) => cx.error_spanned_by(
            data.union_token,
            "`#[derive(EventUnion)]` goes on an enum whose variants each hold one domain event, \
             not on a `union`",
        ),
    }
    if !input.generics.params.is_empty() || input.generics.where_clause.is_some() {
        cx.error_spanned_by(
            &input.generics,
            "event unions cannot be generic: the runtime routes each event type to one concrete \
             union",
        );
    }
    let facade = use_facade(crate_path.as_ref());
    Ok(match cx.check() {
        Ok(()) => expand(ident, &variants, &facade),
        Err(errors) => {
            // A stub, so that handlers of the union report nothing more.
            let mut tokens = errors.into_compile_error();
            if input.generics.params.is_empty() && matches!(input.data, Data::Enum(_)) {
                tokens.extend(stub(ident, &facade));
            }
            tokens
        }
    })
}

/// `#[event(crate = path)]`, the one key a union takes.
fn union_attrs(cx: &Ctxt, input: &DeriveInput) -> Option<Path> {
    let mut crate_path = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("event")) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                if crate_path.is_some() {
                    cx.error_spanned_by(
                        &meta.path,
                        "duplicate `crate` key: it is already set above",
                    );
                }
                crate_path = crate_path_value(cx, &meta)?;
            } else {
                let key = tokens_text(&meta.path);
                cx.error_spanned_by(
                    &meta.path,
                    format_args!(
                        "unknown key `{key}` on an event union: it takes only `crate = path`; \
                         names, versions and aggregate ids belong to the events it holds"
                    ),
                );
                if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
                    let _: TokenStream = meta.input.parse()?;
                }
            }
            Ok(())
        });
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
    crate_path
}

fn expand(ident: &Ident, variants: &[Variant<'_>], facade: &TokenStream) -> TokenStream {
    let mut consts = Vec::new();
    let mut wraps = Vec::new();
    let mut names = Vec::new();
    let mut arms = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        let (vident, ty) = (v.ident, v.ty);
        let c = format_ident!("__V{}", i);
        let mut tokens = ty.to_token_stream().into_iter();
        let first = tokens.next().map_or_else(Span::call_site, |tt| tt.span());
        let last = tokens.last().map_or(first, |tt| tt.span());
        let new = Ident::new("new", last);
        let domain_event = crate::expand::private_path("DomainEvent");
        let variant_clone = crate::expand::private_path("UnionVariantClone");
        // The two bounds first, through trait item paths at the type's span: rustc reports
        // them without a note into event-core, and drops the same bounds of `new` as
        // duplicates (same predicate, same span).
        consts.push(quote_spanned! {first=>
            const #c: _event_core::__private::UnionVariant<#ident> = {
                let _ = <#ty as #domain_event>::NAME;
                let _ = <#ty as #variant_clone>::clone_event;
                _event_core::__private::UnionVariant::#new::<#ty>()
            };
        });
        wraps.push(quote! {
            #[automatically_derived]
            impl _event_core::__private::Variant<#ty> for #ident {
                #[inline]
                fn wrap(event: #ty) -> Self {
                    #ident::#vident(event)
                }
            }
        });
        names.push(c.clone());
        arms.push(quote!(#ident::#vident(_) => #c.name,));
    }
    let mixed = format!(
        "the variants of event union `{ident}` belong to different aggregate types: a union is \
         the stream of one aggregate, ordered by its sequence; give each aggregate its own union"
    );
    let twice = format!(
        "event union `{ident}` holds the same event twice (two versions, or one type under two \
         names): hold only the newest version, older envelopes are upcast to it"
    );
    let check = quote_spanned! {ident.span()=>
        const _: () = _event_core::__private::check_union(
            &[#(#names.aggregate_type),*],
            &[#(#names.name),*],
            #mixed,
            #twice,
        );
    };
    quote! {
        const _: () = {
            #facade
            #(#wraps)*
            #(#consts)*
            const __VARIANTS: &[_event_core::__private::UnionVariant<#ident>] = &[#(#names),*];
            #check

            #[automatically_derived]
            impl _event_core::__private::HandlerEvent for #ident {
                const EVENTS: &'static [fn() -> _event_core::__private::EventDescriptor] =
                    &[#(#names.describe),*];
                fn event_from<'__a>(
                    __ctx: &_event_core::__private::HandlerContext<'__a>,
                ) -> _event_core::__private::Option<_event_core::__private::EventRef<'__a, Self>> {
                    for __v in __VARIANTS {
                        if let _event_core::__private::Some(__u) = (__v.event)(__ctx) {
                            return _event_core::__private::Some(_event_core::__private::EventRef::Owned(__u));
                        }
                    }
                    _event_core::__private::None
                }
                fn envelope_from<'__a>(
                    __ctx: &_event_core::__private::HandlerContext<'__a>,
                ) -> _event_core::__private::Option<
                    _event_core::__private::EventRef<'__a, _event_core::__private::Envelope<Self>>,
                > {
                    for __v in __VARIANTS {
                        if let _event_core::__private::Some(__u) = (__v.envelope)(__ctx) {
                            return _event_core::__private::Some(_event_core::__private::EventRef::Owned(__u));
                        }
                    }
                    _event_core::__private::None
                }
            }

            #[automatically_derived]
            impl _event_core::__private::EventUnion for #ident {
                fn event_name(&self) -> &'static str {
                    match self {
                        #(#arms)*
                    }
                }
            }
        };
    }
}

fn stub(ident: &Ident, facade: &TokenStream) -> TokenStream {
    quote! {
        const _: () = {
            #facade
            #[automatically_derived]
            impl _event_core::__private::HandlerEvent for #ident {
                const EVENTS: &'static [fn() -> _event_core::__private::EventDescriptor] = &[];
                fn event_from<'__a>(
                    _: &_event_core::__private::HandlerContext<'__a>,
                ) -> _event_core::__private::Option<_event_core::__private::EventRef<'__a, Self>> {
                    _event_core::__private::None
                }
                fn envelope_from<'__a>(
                    _: &_event_core::__private::HandlerContext<'__a>,
                ) -> _event_core::__private::Option<
                    _event_core::__private::EventRef<'__a, _event_core::__private::Envelope<Self>>,
                > {
                    _event_core::__private::None
                }
            }
        };
    }
}
