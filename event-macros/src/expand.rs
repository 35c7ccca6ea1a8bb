//! Writes the generated code: the `DomainEvent` impl and its registration; a handler's entry
//! point, descriptor and registration. Every path goes through the facade
//! (`_event_core::__private`), every name it introduces starts with `__`.

use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{DeriveInput, Item, ItemFn, Path, Type};

use crate::ast::{Event, Handler};
use crate::attr;
use crate::check::{self, EventSpec, HandlerSpec, Role};
use crate::ctxt::Ctxt;

/// `use <path> as _event_core;`, the one place the facade's path is written.
pub(crate) fn use_facade(path: Option<&Path>) -> TokenStream {
    match path {
        Some(path) => quote!(use #path as _event_core;),
        None => quote!(
            use ::event_core as _event_core;
        ),
    }
}

/// `_event_core::__private::<name>` at the macro's call site, for a trait in a qualified path
/// (`<T as Trait>::item`) among tokens spanned at the user's type: rustc reports the bound at
/// `T` either way, and a path spanned in the user's code would be flagged by
/// `unused_qualifications` when the user has the trait in scope (`use event_core::DomainEvent`).
pub(crate) fn private_path(name: &str) -> TokenStream {
    let ident = Ident::new(name, Span::call_site());
    quote!(_event_core::__private::#ident)
}

pub(crate) fn derive_domain_event(input: &DeriveInput) -> syn::Result<TokenStream> {
    let cx = Ctxt::new();
    let event = Event::from_ast(&cx, input);
    let spec = check::event(&cx, &event);
    Ok(match cx.check() {
        Ok(()) => event_impl(&event, &spec, true),
        Err(errors) => {
            // Keep an impl next to the errors, so that uses of the type elsewhere do not add
            // "not a domain event" errors to the real one. It is not registered.
            let mut tokens = errors.into_compile_error();
            if spec.concrete {
                tokens.extend(event_impl(&event, &spec, false));
            }
            tokens
        }
    })
}

fn event_impl(event: &Event, spec: &EventSpec, register: bool) -> TokenStream {
    let ident = event.ident;
    let facade = use_facade(event.attrs.crate_path.as_ref());
    let EventSpec {
        name,
        version,
        aggregate_type,
        ..
    } = spec;
    let (id_ty, id_body) = match spec.aggregate_id {
        Some(field) => {
            let (field_ident, ty) = (field.ident, field.ty);
            (quote!(#ty), quote!(&self.#field_ident))
        }
        None => (quote!(str), quote!("")),
    };
    // Spanned at the type's name: a missing serde impl is reported there, with the
    // `SerdeEvent` message, once per missing trait. Not for an enum or union, already
    // rejected: the user would not add serde impls to it.
    let serde_check = private_path("SerdeCheck");
    let describe = event.named.then(|| {
        quote_spanned! {ident.span()=>
            const __DESCRIBE: fn() -> _event_core::__private::EventDescriptor = {
                let () = <#ident as #serde_check>::SERDE;
                _event_core::__private::describe_event::<#ident>()
            };
        }
    });
    // Only with a clean attribute: the stub impl must not add errors of its own.
    let upcast = spec
        .upcast_from
        .filter(|_| register)
        .map(|from| upcaster(ident, from, spec));
    let upcast_from = spec.upcast_from.filter(|_| register).map(|from| {
        // At the value too: a failed check's "erroneous constant" note points there.
        let span = from
            .to_token_stream()
            .into_iter()
            .next()
            .map_or_else(Span::call_site, |tt| tt.span());
        let constant = quote_spanned!(span=> __UPCAST);
        quote! {
            const UPCAST_FROM: _event_core::__private::Option<_event_core::__private::Upcaster> =
                _event_core::__private::Some(#constant);
        }
    });
    let deny_unknown_fields = spec.deny_unknown_fields.then(|| {
        quote!(
            const DENY_UNKNOWN_FIELDS: bool = true;
        )
    });
    let sensitive = (!spec.sensitive.is_empty()).then(|| {
        let names = &spec.sensitive;
        quote!(
            const SENSITIVE_FIELDS: &'static [&'static str] = &[#(#names),*];
        )
    });
    let registration = register.then(|| {
        quote! {
            _event_core::__private::inventory::submit! {
                _event_core::__private::EventRegistration { describe: __DESCRIBE }
            }
        }
    });
    quote! {
        const _: () = {
            #facade

            // The bound is the supertraits again, through one trait with a clear message.
            // Without it a missing serde impl fails the impl itself, with one error per
            // supertrait and item. With it the impl is well-formed and applies only if the
            // bound holds; `describe_event` reports the bound. `for<'__a>` keeps rustc from
            // rejecting the bound as trivially false where it is written.
            #[automatically_derived]
            impl _event_core::__private::DomainEvent for #ident
            where
                for<'__a> #ident: _event_core::__private::SerdeEvent,
            {
                const NAME: &'static str = #name;
                const VERSION: u32 = #version;
                const AGGREGATE_TYPE: &'static str = #aggregate_type;
                type AggregateId = #id_ty;
                #[inline]
                fn aggregate_id(&self) -> &Self::AggregateId {
                    #id_body
                }
                fn json_schema() -> _event_core::__private::Option<_event_core::__private::serde_json::Value> {
                    #[allow(unused_imports)]
                    use _event_core::__private::{NoSchema as _, SchemaOf as _};
                    (&_event_core::__private::SchemaProbe::<#ident>::NEW).json_schema()
                }
                #upcast_from
                #deny_unknown_fields
                #sensitive
            }

            #upcast
            #describe
            #registration
        };
    }
}

/// `const __UPCAST: Upcaster = upcaster::<From, Event>(…);`, spanned from the first to the last
/// token of the user's `upcast_from` value: rustc reports an unmet bound on `From` and a failed
/// check (const evaluation) at the call, so the error underlines the value. The `From<From>`
/// bound is reported at the second type argument, given the value's last span for that.
fn upcaster(ident: &Ident, from: &Type, spec: &EventSpec) -> TokenStream {
    let mut tokens = from.to_token_stream().into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |tt| tt.span());
    let last = tokens.last().map_or(first, |tt| tt.span());
    let mut target = ident.clone();
    target.set_span(last);
    let from_text = check::tokens_text(from);
    let (name, version) = (&spec.name, spec.version);
    let other_name = format!(
        "`upcast_from = {from_text}` names another event: an upcaster converts an older version \
         of the same event, so `{from_text}` must have `name = {name:?}` like `{ident}`"
    );
    let not_older = format!(
        "`upcast_from = {from_text}` is not an older version: an upcaster converts an older \
         version into a newer one, so the version of `{from_text}` must be lower than \
         {version}, the version of `{ident}`"
    );
    let path = quote_spanned!(first=> _event_core::__private::upcaster::<#from, #target>);
    let args = quote_spanned!(last=> (#name, #version, #other_name, #not_older));
    // The bounds of `upcaster` first, through trait item paths at the spans rustc reports the
    // call's bounds at (`F` for `F`'s, the second type argument for `T`'s): they are reported
    // without a note into event-core, and the call's same bounds are dropped as duplicates.
    let (domain_event, upcast_source) = (private_path("DomainEvent"), private_path("UpcastSource"));
    let upcast_from = {
        let path = private_path("UpcastFrom");
        quote!(#path<#from>)
    };
    let clone = quote_spanned!(first=> <#from as #upcast_source>);
    let convert = quote_spanned!(last=> <#target as #upcast_from>::upcast);
    quote_spanned! {first=>
        const __UPCAST: _event_core::__private::Upcaster = {
            let _ = <#from as #domain_event>::NAME;
            let _ = #clone::clone_event;
            let _ = #convert;
            #path #args
        };
    }
}

pub(crate) fn event_handler(args: TokenStream, input: TokenStream) -> syn::Result<TokenStream> {
    let parsed = match syn::parse2::<Item>(input.clone()) {
        Ok(item) => item,
        // A body that does not parse yet (half-typed code in an editor): rustc reports the
        // syntax error itself when it reads the function, which is emitted unchanged. With the
        // signature alone, the handler is still checked and registered, so callers of the
        // function and of `handler::<name>()` see nothing more.
        Err(error) => match syn::parse2::<MaybeItemFn>(input.clone()) {
            Ok(MaybeItemFn(item)) => Item::Fn(item),
            // Not even a signature: the input goes back unchanged beside the error (as
            // tokio-macros' `token_stream_with_error`), so the item does not vanish with it.
            Err(_) => {
                let error = error.into_compile_error();
                return Ok(quote!(#input #error));
            }
        },
    };
    let item = match parsed {
        Item::Fn(item) => item,
        item => {
            let error = syn::Error::new_spanned(
                item_head(&item),
                "`#[event_handler]` goes on a free `fn` or `async fn` whose first parameter is \
                 the event: `fn on_order_placed(event: &OrderPlaced)`",
            );
            let error = error.into_compile_error();
            return Ok(quote!(#input #error));
        }
    };
    let cx = Ctxt::new();
    let attrs = attr::handler_attrs(&cx, args);
    let handler = Handler::from_ast(&cx, &item, attrs);
    let spec = check::handler(&cx, &handler);
    // A function with a `self` receiver or naming `Self` is in an `impl` block (or a trait),
    // where a struct cannot go: `check` reported it, and nothing else is emitted.
    let in_impl = item.sig.receiver().is_some() || spec.uses_self;
    Ok(match cx.check() {
        Ok(()) => {
            let registration = handler_registration(&handler, &spec);
            let facade = use_facade(handler.attrs.crate_path.as_ref());
            let free = free_function_check(&item, &facade);
            quote! {
                #input
                #registration
                #free
            }
        }
        Err(errors) => {
            // The function stays as written (it compiles on its own, and unit tests call it);
            // the marker type keeps `handler::<name>()` from adding unrelated errors.
            let marker = (!in_impl).then(|| marker_struct(&item, TokenStream::new()));
            let errors = errors.into_compile_error();
            quote! {
                #input
                #marker
                #errors
            }
        }
    })
}

/// A function whose body is kept as raw tokens (tracing-attributes' `MaybeItemFn`): the
/// attributes, visibility and signature parse, the braces hold anything.
struct MaybeItemFn(ItemFn);

impl syn::parse::Parse for MaybeItemFn {
    fn parse(input: syn::parse::ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(syn::Attribute::parse_outer)?;
        let vis: syn::Visibility = input.parse()?;
        let sig: syn::Signature = input.parse()?;
        let content;
        let brace_token = syn::braced!(content in input);
        let body: TokenStream = content.parse()?;
        // The raw body as a verbatim statement: its tokens stay visible to the checks that
        // read the body (`Self` in it), and nothing else reads it (the function itself is
        // emitted from the input).
        let block = syn::Block {
            brace_token,
            stmts: vec![syn::Stmt::Item(Item::Verbatim(body))],
        };
        Ok(MaybeItemFn(ItemFn {
            attrs,
            vis,
            modifiers: syn::FnModifiers::default(),
            sig,
            block: Box::new(block),
        }))
    }
}

/// Proves that the handler is a free function, for a function in an `impl` block that neither
/// takes `self` nor names `Self` (nothing in its tokens tells it apart). Both items are valid
/// in an `impl` block too, unlike the marker struct, which rustc drops there with its own
/// error ("struct is not supported in `trait`s or `impl`s"), taking the whole registration
/// with it; these two then add the error that says what to do.
///
/// Next to a free function, `__event_handler_<name>_is_free` is a constant in scope, and the
/// pattern naming it compares with it (a `u8`). Next to an associated function it is an associated
/// constant, not in scope by its bare name: the pattern binds a fresh variable instead, whose
/// type is the literal's fallback, `i32`, and `FreeFunction` (implemented for `u8`) fails.
fn free_function_check(item: &ItemFn, facade: &TokenStream) -> TokenStream {
    let ident = &item.sig.ident;
    let span = ident.span();
    // Suffixes, not prefixes: `free_a`'s names cannot be `a`'s.
    let probe = format_ident!("__event_handler_{}_is_free", ident.unraw(), span = span);
    let check = format_ident!("__event_handler_{}_check", ident.unraw(), span = span);
    let free_function = private_path("FreeFunction");
    let call = quote_spanned! {span=>
        <_ as #free_function>::free_function(&#probe)
    };
    quote_spanned! {span=>
        #[doc(hidden)]
        #[allow(non_upper_case_globals, dead_code)]
        const #probe: u8 = 0;
        #[doc(hidden)]
        #[allow(non_upper_case_globals, dead_code, irrefutable_let_patterns)]
        const #check: fn() = || {
            #facade
            if let #probe = 0 {
                #call;
            }
        };
    }
}

/// The first tokens of an item that is not a function, to point at.
fn item_head(item: &Item) -> TokenStream {
    match item {
        Item::Struct(item) => {
            let (token, ident) = (&item.struct_token, &item.ident);
            quote!(#token #ident)
        }
        Item::Enum(item) => {
            let (token, ident) = (&item.enum_token, &item.ident);
            quote!(#token #ident)
        }
        Item::Impl(item) => item.impl_token.to_token_stream(),
        Item::Mod(item) => {
            let (token, ident) = (&item.mod_token, &item.ident);
            quote!(#token #ident)
        }
        Item::Trait(item) => {
            let (token, ident) = (&item.trait_token, &item.ident);
            quote!(#token #ident)
        }
        Item::Const(item) => {
            let (token, ident) = (&item.const_token, &item.ident);
            quote!(#token #ident)
        }
        Item::Static(item) => {
            let (token, ident) = (&item.static_token, &item.ident);
            quote!(#token #ident)
        }
        Item::Type(item) => {
            let (token, ident) = (&item.type_token, &item.ident);
            quote!(#token #ident)
        }
        item => item.to_token_stream(),
    }
}

/// A braced struct named like the function: it lives in the type namespace only, so it does
/// not clash with the function, and `Handler` is implemented on it.
///
/// The registration (`registration`: the entry point, the descriptor, the `Handler` impl and
/// the `inventory` submission) sits inside the struct, in the length of a zero-sized array
/// field: in an `impl` block rustc rejects the struct with one error and drops it whole, so
/// nothing in the registration adds errors of its own there.
fn marker_struct(item: &ItemFn, registration: TokenStream) -> TokenStream {
    let vis = &item.vis;
    let ident = &item.sig.ident;
    if registration.is_empty() {
        return quote! {
            #[doc(hidden)]
            #[allow(non_camel_case_types, dead_code)]
            #vis struct #ident {}
        };
    }
    quote! {
        #[doc(hidden)]
        #[allow(non_camel_case_types, dead_code, non_local_definitions)]
        #vis struct #ident {
            __registration: [(); {
                #registration
                0
            }],
        }
    }
}

fn handler_registration(handler: &Handler, spec: &HandlerSpec) -> TokenStream {
    let item = handler.item;
    let sig = &item.sig;
    let ident = &sig.ident;
    let facade = use_facade(handler.attrs.crate_path.as_ref());
    let is_async = sig.asyncness.is_some();

    // One adapter `const` per parameter, spanned at the parameter's type: the only place the
    // generated code states a trait bound on it, so a wrong type is reported once, there.
    let mut adapters = Vec::new();
    let mut extract_tx = None;
    let mut extract = Vec::new();
    let mut args = Vec::new();
    let mut resources = Vec::new();
    let mut transaction = quote!(_event_core::__private::None);
    let mut has_event = false;
    for role in &spec.params {
        match role {
            Role::Event(ty) => {
                adapters.push(event_adapter(ty));
                extract.push(quote!(let __event = (__EVENT.get)(__ctx)?;));
                args.push(quote!(&*__event));
                has_event = true;
            }
            Role::Resource(index, ty) => {
                let name = format_ident!("__RESOURCE_{}", index);
                let local = format_ident!("__resource_{}", index);
                adapters.push(resource_adapter(&name, ty));
                extract.push(quote!(let #local = (#name.get)(__ctx, #index)?;));
                args.push(quote!(#local));
                resources.push(quote!(#name.descriptor));
            }
            Role::Transaction(ty) => {
                adapters.push(transaction_adapter(ty));
                // Taken first: it needs the context mutably, the others share it.
                extract_tx = Some(quote!(let __transaction = (__TRANSACTION.take)(__ctx)?;));
                args.push(quote!(__transaction));
                transaction = quote!(_event_core::__private::Some(__TRANSACTION.descriptor));
            }
        }
    }
    // `check` reported a handler without a usable event parameter; nothing to emit.
    if !has_event {
        return TokenStream::new();
    }

    let call = if is_async {
        quote!(#ident(#(#args),*).await)
    } else {
        quote!(#ident(#(#args),*))
    };
    let convert = match spec.output {
        None => quote!({
            #call;
            _event_core::__private::Ok(())
        }),
        Some(ty) if nameable(ty) => {
            adapters.push(return_adapter(ty));
            quote!(__RETURN.convert(#call))
        }
        // `impl Trait` or elided lifetimes cannot be named in a `const`: convert in place.
        Some(ty) => {
            let into = private_path("IntoHandlerResult");
            quote_spanned!(ty.span()=> <_ as #into>::into_handler_result(#call))
        }
    };

    // Spanned at the user's `async`: a future that is not `Send` is reported there.
    let async_span = sig
        .asyncness
        .map_or_else(Span::call_site, |token| token.span);
    let async_block = quote_spanned! {async_span=>
        async move {
            #extract_tx
            #(#extract)*
            #convert
        }
    };
    // Coerced to `HandlerFuture` where it is returned: a future that is not `Send` is reported
    // there, naming only the cast to `Pin<Box<dyn Future + Send>>`.
    let boxed = quote_spanned!(async_span=> _event_core::__private::box_pin(#async_block));
    let (entry, handler_call) = if is_async {
        (
            quote! {
                fn __call<'__a, '__b>(
                    __ctx: &'__a mut _event_core::__private::HandlerContext<'__b>,
                ) -> _event_core::__private::HandlerFuture<'__a> {
                    #boxed
                }
            },
            quote!(_event_core::__private::HandlerCall::Async(__call)),
        )
    } else {
        (
            quote! {
                fn __call(
                    __ctx: &mut _event_core::__private::HandlerContext<'_>,
                ) -> _event_core::__private::Result<(), _event_core::__private::HandlerError> {
                    #extract_tx
                    #(#extract)*
                    #convert
                }
            },
            quote!(_event_core::__private::HandlerCall::Sync(__call)),
        )
    };

    let name = match spec.name {
        Some(lit) => quote!(#lit),
        None => {
            let suffix = format!("::{}", ident.unraw());
            quote!(_event_core::__private::concat!(_event_core::__private::module_path!(), #suffix))
        }
    };
    let priority = spec.priority;
    let mode = if spec.in_transaction {
        quote!(InTransaction)
    } else {
        quote!(AfterCommit)
    };
    let ordered = !spec.unordered;
    // `line!()` at the function's name reports the function's line, not the attribute's.
    let location = quote_spanned! {ident.span()=>
        file: _event_core::__private::file!(),
        line: _event_core::__private::line!(),
    };

    let registration = quote! {
        #facade

        #(#adapters)*

        #entry

        static __DESCRIPTOR: _event_core::__private::HandlerDescriptor =
            _event_core::__private::HandlerDescriptor {
                name: #name,
                events: __EVENT.events,
                priority: #priority,
                mode: _event_core::__private::DeliveryMode::#mode,
                ordered: #ordered,
                resources: &[#(#resources),*],
                transaction: #transaction,
                takes_envelope: __EVENT.takes_envelope,
                call: #handler_call,
                #location
            };

        #[automatically_derived]
        impl _event_core::__private::Handler for #ident {
            const DESCRIPTOR: &'static _event_core::__private::HandlerDescriptor = &__DESCRIPTOR;
        }

        _event_core::__private::inventory::submit! {
            _event_core::__private::HandlerRegistration { descriptor: &__DESCRIPTOR }
        }
    };
    marker_struct(item, registration)
}

/// The first and the last span of the user's `ty`: an unmet bound on `<T as Trait>` is
/// reported at `T`, so spanning the generated tokens from the first to the last token of the
/// type underlines the whole type.
fn type_spans(ty: &Type) -> (Span, Span) {
    let mut tokens = ty.to_token_stream().into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |tt| tt.span());
    let last = tokens.last().map_or(first, |tt| tt.span());
    (first, last)
}

/// `const __EVENT: EventParam<A> = EventParam { get: <A as EventArg>::from_context, … };`.
/// The three paths state one bound at one span, which rustc reports once.
fn event_adapter(ty: &Type) -> TokenStream {
    let (first, _) = type_spans(ty);
    let event_arg = private_path("EventArg");
    let q = quote_spanned!(first=> <#ty as #event_arg>);
    quote_spanned! {first=>
        const __EVENT: _event_core::__private::EventParam<#ty> = _event_core::__private::EventParam {
            get: #q::from_context,
            events: #q::EVENTS,
            takes_envelope: #q::IS_ENVELOPE,
        };
    }
}

/// `const __RESOURCE_n: ResourceParam<T> = …`, and the check that `T` is not a second event.
fn resource_adapter(name: &Ident, ty: &Type) -> TokenStream {
    let (first, last) = type_spans(ty);
    // Spanned from the first to the last token of the type, which the error underlines.
    let check = Ident::new("check", last);
    let kind = quote_spanned!(last=> event_kind());
    let resource_arg = private_path("ResourceArg");
    // `OneEvent::<T>::check(&kind)` spanned in the user's type, unlike the trait paths: rustc
    // reports this bound at the argument and the call, which then both underline the type.
    quote_spanned! {first=>
        const #name: _event_core::__private::ResourceParam<#ty> = _event_core::__private::ResourceParam {
            get: <#ty as #resource_arg>::get,
            descriptor: _event_core::__private::ResourceDescriptor::of::<#ty>(),
        };
        // Type-checked, never run: the probe's method is `SecondEvent`'s when `T` is an event.
        const _: fn() = || {
            #[allow(unused_imports)]
            use _event_core::__private::{ProbeEvent as _, ProbeNotEvent as _};
            _event_core::__private::OneEvent::<#ty>::#check(
                &(&_event_core::__private::EventProbe::<#ty>::NEW).#kind,
            );
        };
    }
}

/// `const __TRANSACTION: TransactionParam<T> = …`.
fn transaction_adapter(ty: &Type) -> TokenStream {
    let (first, _) = type_spans(ty);
    let transaction_arg = private_path("TransactionArg");
    quote_spanned! {first=>
        const __TRANSACTION: _event_core::__private::TransactionParam<#ty> = _event_core::__private::TransactionParam {
            take: <#ty as #transaction_arg>::take,
            descriptor: _event_core::__private::ResourceDescriptor::of::<#ty>(),
        };
    }
}

/// `const __RETURN: ReturnParam<R, E> = ReturnParam { split: <R as ReturnArg>::split, error:
/// <E as ErrorArg>::… };` with `E = <R as ReturnArg>::Error`: a return type that is neither
/// `()` nor a `Result<(), E>` is reported as `ReturnArg`, an error type that does not convert
/// as `ErrorArg`, each once, at the return type.
fn return_adapter(ty: &Type) -> TokenStream {
    let (first, _) = type_spans(ty);
    if let Some(error) = result_error_type(ty) {
        let return_arg = private_path("ReturnArg");
        let error_arg = private_path("ErrorArg");
        let (error_first, _) = type_spans(error);
        let convert = quote_spanned!(error_first=> <#error as #error_arg>::into_handler_error);
        return quote_spanned! {first=>
            const __RETURN: _event_core::__private::ReturnParam<#ty, #error> = _event_core::__private::ReturnParam {
                split: <#ty as #return_arg>::split,
                error: #convert,
            };
        };
    }
    let into = private_path("IntoHandlerResult");
    quote_spanned! {first=>
        const __RETURN: _event_core::__private::ReturnParam<#ty, _event_core::__private::HandlerError> = _event_core::__private::ReturnParam {
            split: <#ty as #into>::into_handler_result,
            error: _event_core::__private::same_error,
        };
    }
}

/// `E` of a return type written `Result<(), E>` (any path ending in `Result`), checked on its
/// own so that an error type that does not convert is reported at it, with its own message.
/// Other types (`()`, an alias such as `io::Result<()>`, `Result<u32, E>`) are checked whole.
fn result_error_type(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else { return None };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().map(|arg| match arg {
        syn::GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(Some(Type::Tuple(unit))), Some(Some(error)), None) if unit.elems.is_empty() => {
            Some(error)
        }
        _ => None,
    }
}

/// Whether `ty` can be written as the type of a `const`: no `impl Trait`, no elided (`&T`)
/// or anonymous (`'_`) lifetime.
fn nameable(ty: &Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        let mut after_and = false;
        for tt in tokens {
            match &tt {
                TokenTree::Ident(ident) if ident == "impl" || ident == "_" => return false,
                TokenTree::Group(group) if !walk(group.stream()) => return false,
                _ => {}
            }
            let is_quote = matches!(&tt, TokenTree::Punct(p) if p.as_char() == '\'');
            if after_and && !is_quote {
                return false;
            }
            after_and = matches!(&tt, TokenTree::Punct(p) if p.as_char() == '&');
        }
        !after_and
    }
    walk(ty.to_token_stream())
}
