//! The rules an event and a handler must follow, over the whole model at once (a name, its
//! default aggregate, the fields; the parameters and their order). Reports each violation at
//! the offending token and returns what `expand` needs, with harmless defaults on error.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::{LitStr, PatType, ReturnType, Safety, Type, TypeReference};

use crate::ast::{Event, Field, Handler};
use crate::ctxt::Ctxt;

/// What the derive emits for one event.
pub(crate) struct EventSpec<'a> {
    pub(crate) name: String,
    pub(crate) version: u32,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: Option<&'a Field<'a>>,
    /// The previous version, to upcast from.
    pub(crate) upcast_from: Option<&'a Type>,
    pub(crate) deny_unknown_fields: bool,
    /// The JSON names of the fields marked `#[event(sensitive)]`, in declaration order.
    pub(crate) sensitive: Vec<String>,
    /// The type has no generics, so an impl (real or stub) can be written for it.
    pub(crate) concrete: bool,
}

const NAME_CONVENTION: &str = "event names are lower-case, dot-separated `context.action`, \
     like \"order.placed\" or \"billing.invoice_sent\"";

pub(crate) fn event<'a>(cx: &Ctxt, event: &'a Event<'a>) -> EventSpec<'a> {
    let generics = event.generics;
    let mut concrete = true;
    if !generics.params.is_empty() {
        concrete = false;
        cx.error_spanned_by(
            generics,
            "domain events cannot be generic: an event name and version identify one concrete \
             type on the wire",
        );
    } else if let Some(where_clause) = &generics.where_clause {
        cx.error_spanned_by(
            where_clause,
            "domain events cannot have a `where` clause: an event is one concrete type",
        );
    }

    let attrs = &event.attrs;
    let name = match &attrs.name {
        Some(lit) => {
            let name = lit.value();
            if let Err(reason) = check_event_name(&name) {
                cx.error_spanned_by(
                    lit,
                    format_args!("invalid event name {name:?}: {reason}; {NAME_CONVENTION}"),
                );
            }
            name
        }
        None => {
            if !attrs.malformed {
                cx.error_spanned_by(
                    event.ident,
                    format_args!(
                        "missing event name: add `{}` to `{}`",
                        crate::attr::EVENT_USAGE,
                        event.ident
                    ),
                );
            }
            String::new()
        }
    };

    let version = match &attrs.version {
        Some(int) => match u32::try_from(int.value) {
            Ok(0) => {
                cx.error_spanned_by(
                    &int.tokens,
                    "event versions start at 1: `version = 1` is the first shape of an event, \
                     and each incompatible change adds one",
                );
                1
            }
            Ok(version) => version,
            Err(_) => {
                cx.error_spanned_by(
                    &int.tokens,
                    format_args!("event version must be between 1 and {}", u32::MAX),
                );
                1
            }
        },
        None => 1,
    };

    if let Some(from) = &attrs.upcast_from {
        if version == 1 {
            let at = attrs
                .version
                .as_ref()
                .map_or_else(|| from.to_token_stream(), |int| int.tokens.clone());
            cx.error_spanned_by(
                at,
                format_args!(
                    "`upcast_from = {}` needs this event's `version` to be above 1: an upcaster \
                     converts an older version into this one, and version 1 is the first",
                    tokens_text(from)
                ),
            );
        }
    }

    let aggregate_type = match &attrs.aggregate {
        Some(lit) => {
            let aggregate = lit.value();
            if let Err(reason) = check_segment(&aggregate) {
                cx.error_spanned_by(
                    lit,
                    format_args!(
                        "invalid aggregate type {aggregate:?}: {reason}; aggregate types are \
                         lower-case identifiers like \"order\" or \"shopping_cart\""
                    ),
                );
            }
            aggregate
        }
        None => name.split('.').next().unwrap_or_default().to_owned(),
    };

    let mut aggregate_id: Option<&Field> = None;
    for field in &event.fields {
        let Some(key) = &field.aggregate_id else {
            continue;
        };
        match aggregate_id {
            None => aggregate_id = Some(field),
            Some(first) => cx.error_spanned_by(
                key,
                format_args!(
                    "only one field can be `#[event(aggregate_id)]`: `{}` already is",
                    first.ident
                ),
            ),
        }
    }
    if event.named && aggregate_id.is_none() {
        cx.error_spanned_by(
            event.ident,
            format_args!(
                "missing aggregate id: mark the field of `{}` that identifies the aggregate \
                 instance with `#[event(aggregate_id)]`",
                event.ident
            ),
        );
    }

    let sensitive = sensitive_fields(cx, event);

    EventSpec {
        name,
        version,
        aggregate_type,
        aggregate_id,
        sensitive,
        upcast_from: attrs.upcast_from.as_ref(),
        deny_unknown_fields: attrs.deny_unknown_fields.is_some(),
        concrete,
    }
}

/// The same rule as `event_core::check_event_name` (this crate cannot depend on event-core):
/// lower-case ASCII letters, digits and `_`, in two or more non-empty segments separated by
/// single dots, each segment starting with a letter.
fn check_event_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("the name is empty");
    }
    let mut segments = 0;
    for segment in name.split('.') {
        segments += 1;
        check_segment(segment)?;
    }
    if segments < 2 {
        return Err("the name needs at least two segments, `context.action`");
    }
    Ok(())
}

fn check_segment(segment: &str) -> Result<(), &'static str> {
    let mut chars = segment.chars();
    match chars.next() {
        None => return Err("a segment is empty (leading, trailing or doubled `.`)"),
        Some(c) if !c.is_ascii_lowercase() => {
            return Err("each segment must start with a lower-case ASCII letter")
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Err("segments may only hold lower-case ASCII letters, digits and `_`");
    }
    Ok(())
}

/// What a handler parameter is to the runtime.
pub(crate) enum Role<'a> {
    /// `&E` or `&Envelope<E>`: the type behind the reference.
    Event(&'a Type),
    /// `&T`: the index among resources and `T`.
    Resource(usize, &'a Type),
    /// `&mut T`: the open transaction.
    Transaction(&'a Type),
}

/// What `#[event_handler]` emits for one function.
pub(crate) struct HandlerSpec<'a> {
    /// In parameter order.
    pub(crate) params: Vec<Role<'a>>,
    pub(crate) priority: i32,
    pub(crate) name: Option<&'a LitStr>,
    pub(crate) in_transaction: bool,
    pub(crate) unordered: bool,
    /// The return type, `None` for `()` written as nothing.
    pub(crate) output: Option<&'a Type>,
    /// The function names `Self` (outside items nested in its body), so it is in an `impl`
    /// block or a trait; reported.
    pub(crate) uses_self: bool,
}

pub(crate) fn handler<'a>(cx: &Ctxt, handler: &'a Handler<'a>) -> HandlerSpec<'a> {
    let sig = &handler.item.sig;
    let fn_name = &sig.ident;

    if let Safety::Unsafe(unsafe_token) = &sig.safety {
        cx.error_spanned_by(
            unsafe_token,
            "event handlers cannot be `unsafe fn`: the runtime has no way to uphold their \
             safety contract; make the function safe and use an `unsafe` block inside",
        );
    }
    let generics = &sig.generics;
    if !generics.params.is_empty() {
        cx.error_spanned_by(
            generics,
            "event handlers cannot be generic: the runtime calls one concrete function per event \
             type; write one handler per event, or call a generic function from a concrete one",
        );
    }
    if let Some(where_clause) = &generics.where_clause {
        cx.error_spanned_by(
            where_clause,
            "event handlers cannot have a `where` clause: the runtime calls one concrete function",
        );
    }

    // A receiver is reported by `ast`. Without one, `Self` is the only sign in the function's
    // own tokens that it sits in an `impl` block; `expand` covers the remaining case.
    let uses_self = sig.receiver().is_none()
        && (names_self(sig.inputs.to_token_stream())
            || names_self(sig.output.to_token_stream())
            || names_self(handler.item.block.to_token_stream()));
    if uses_self {
        let fn_token = &sig.fn_token;
        cx.error_spanned_by(
            quote!(#fn_token #fn_name),
            format_args!(
                "`#[event_handler]` goes on a free function, and `{fn_name}` names `Self`, so it \
                 is in an `impl` block: the runtime calls a handler with no value or type to \
                 call it on; move `{fn_name}` out of the `impl` block (naming the type instead \
                 of `Self`), or keep it there and call it from a free `#[event_handler]` function"
            ),
        );
    }

    let mut params = Vec::new();
    let mut transaction: Option<&TypeReference> = None;
    let mut resources = 0;
    if sig.inputs.is_empty() {
        cx.syn_error(syn::Error::new(
            sig.paren_token.span.join(),
            format_args!(
                "an event handler takes the event as its first parameter: \
                 `fn {fn_name}(event: &OrderPlaced)`"
            ),
        ));
    }
    for (index, param) in handler.params.iter().enumerate() {
        let ty = ungroup(&param.ty);
        if let Some(impl_token) = find_impl(ty.to_token_stream()) {
            cx.syn_error(syn::Error::new(
                impl_token,
                "event handlers cannot be generic: `impl Trait` in a parameter makes the function \
                 generic; name the concrete type",
            ));
            continue;
        }
        let reference = match ty {
            Type::Reference(reference) => Some(reference),
            _ => None,
        };
        // The first typed parameter is the event (a `self` before it was reported).
        if index == 0 {
            match reference {
                Some(r) if r.mutability.is_none() => params.push(Role::Event(&r.elem)),
                // `&mut T` first and a shared `&E` after it: most likely the transaction
                // written before the event, not the event borrowed mutably.
                Some(r) if later_shared(&handler.params[1..]).is_some() => {
                    let event = later_shared(&handler.params[1..]).expect("checked");
                    let (pat, tx) = (&handler.params[0].pat, &r.elem);
                    cx.error_spanned_by(
                        handler.params[0],
                        format_args!(
                            "the event must be the first parameter of a handler: `&mut {tx}` \
                             here is taken for the event; the open transaction goes after \
                             it, `fn {fn_name}({event_pat}: &{event_ty}, {pat}: &mut {tx}, …)`",
                            tx = tokens_text(tx),
                            pat = tokens_text(pat),
                            event_pat = tokens_text(&event.pat),
                            event_ty = tokens_text(event.ty),
                        ),
                    );
                }
                Some(r) => {
                    let (and, mutability) = (&r.and_token, &r.mutability);
                    cx.error_spanned_by(
                        quote!(#and #mutability),
                        format_args!(
                            "the event parameter is borrowed shared, `&{}`: every handler of an \
                             event sees the same value, so none may change it",
                            tokens_text(&r.elem)
                        ),
                    );
                }
                None => cx.error_spanned_by(
                    ty,
                    format_args!(
                        "the event parameter must be borrowed, `&{0}` (or `&Envelope<{0}>` for \
                         its metadata): the runtime keeps the event to deliver it to other \
                         handlers",
                        tokens_text(ty)
                    ),
                ),
            }
            continue;
        }
        match reference {
            Some(r) if r.mutability.is_none() => {
                params.push(Role::Resource(resources, &r.elem));
                resources += 1;
            }
            Some(r) => match transaction {
                None => {
                    transaction = Some(r);
                    params.push(Role::Transaction(&r.elem));
                }
                Some(first) => {
                    let (and, mutability) = (&r.and_token, &r.mutability);
                    cx.error_spanned_by(
                        quote!(#and #mutability),
                        format_args!(
                            "a handler takes at most one `&mut` parameter, the open transaction, \
                             and `&mut {}` already is; take other parameters as `&T` resources",
                            tokens_text(&first.elem)
                        ),
                    );
                }
            },
            None => cx.error_spanned_by(
                ty,
                format_args!(
                    "resource parameters must be borrowed, `&{}`: the runtime shares one \
                     instance between handlers and workers",
                    tokens_text(ty)
                ),
            ),
        }
    }

    let attrs = &handler.attrs;
    let priority = match &attrs.priority {
        Some(int) => i32::try_from(int.value).unwrap_or_else(|_| {
            cx.error_spanned_by(
                &int.tokens,
                format_args!("priority must be between {} and {}", i32::MIN, i32::MAX),
            );
            0
        }),
        None => 0,
    };
    if let Some(name) = &attrs.name {
        if name.value().trim().is_empty() {
            cx.error_spanned_by(
                name,
                "handler name is empty: it is the first half of the idempotency key, pick a \
                 stable one like \"billing.on_order_placed\", or leave `name` out to use the \
                 module path and function name",
            );
        }
    }

    HandlerSpec {
        params,
        priority,
        name: attrs.name.as_ref(),
        in_transaction: attrs.in_transaction,
        unordered: attrs.unordered,
        output: match &sig.output {
            ReturnType::Default => None,
            ReturnType::Type(_, ty) => Some(ty),
        },
        uses_self,
    }
}

/// A parameter's pattern and the type behind its shared reference.
struct Shared<'a> {
    pat: &'a syn::Pat,
    ty: &'a Type,
}

/// The first of `params` taken by shared reference (`&T`): where the event would be when the
/// first parameter is the transaction.
fn later_shared<'a>(params: &[&'a PatType]) -> Option<Shared<'a>> {
    params.iter().find_map(|param| match ungroup(&param.ty) {
        Type::Reference(r) if r.mutability.is_none() => Some(Shared {
            pat: &param.pat,
            ty: &r.elem,
        }),
        _ => None,
    })
}

/// Whether `tokens` name `Self`, not counting the bodies of items nested in them (`impl`,
/// `trait`, `struct`, `enum`, `union`, `fn` and `mod` blocks), where `Self` is another type or
/// not in scope.
fn names_self(tokens: TokenStream) -> bool {
    let mut in_item = false;
    for tt in tokens {
        match &tt {
            TokenTree::Ident(ident) if ident == "Self" && !in_item => return true,
            TokenTree::Ident(ident)
                if ["impl", "trait", "struct", "enum", "union", "fn", "mod"]
                    .iter()
                    .any(|kw| ident == kw) =>
            {
                in_item = true;
            }
            TokenTree::Punct(p) if p.as_char() == ';' => in_item = false,
            TokenTree::Group(group) => {
                if in_item {
                    // The item's braces end it; its parameters and bounds are skipped too.
                    if group.delimiter() == proc_macro2::Delimiter::Brace {
                        in_item = false;
                    }
                } else if names_self(group.stream()) {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// Types from `macro_rules!` arrive wrapped in invisible groups.
fn ungroup(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => ungroup(&group.elem),
        Type::Paren(paren) => ungroup(&paren.elem),
        ty => ty,
    }
}

/// The span of the first `impl` keyword in `tokens`, at any depth.
pub(crate) fn find_impl(tokens: TokenStream) -> Option<Span> {
    tokens.into_iter().find_map(|tt| match tt {
        TokenTree::Ident(ident) if ident == "impl" => Some(ident.span()),
        TokenTree::Group(group) => find_impl(group.stream()),
        _ => None,
    })
}

/// A type as the user would write it, for messages.
pub(crate) fn tokens_text(tokens: &impl ToTokens) -> String {
    let text = tokens.to_token_stream().to_string();
    // `TokenStream`'s `Display` spaces every token; close up the common cases.
    text.replace(" :: ", "::")
        .replace(" < ", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace("& ", "&")
}

/// The JSON names of the fields marked `#[event(sensitive)]`: serde's names, after
/// `#[serde(rename = "…")]` or the struct's `#[serde(rename_all = "…")]`.
fn sensitive_fields(cx: &Ctxt, event: &Event) -> Vec<String> {
    let mut names = Vec::new();
    for field in &event.fields {
        let Some(key) = &field.sensitive else {
            continue;
        };
        if field.aggregate_id.is_some() {
            cx.error_spanned_by(
                key,
                "the aggregate id cannot be `sensitive`: it is the envelope's CloudEvents \
                 `subject`, in every log line, span and broker subject; identify \
                 the aggregate by an opaque id (a UUID) and keep the personal value in a \
                 sensitive field",
            );
            continue;
        }
        if let Some((tokens, why)) = field.serde.unsupported.as_ref() {
            cx.error_spanned_by(tokens, why);
            continue;
        }
        let name = match &field.serde.rename {
            Some(lit) => lit.value(),
            None => {
                let ident = field.ident.to_string();
                let ident = ident.strip_prefix("r#").unwrap_or(&ident).to_owned();
                match (&event.rename_all.rename, &event.rename_all.unsupported) {
                    (_, Some((tokens, _))) => {
                        cx.error_spanned_by(
                            tokens,
                            "`#[event(sensitive)]` follows `#[serde(rename_all = \"…\")]`, not \
                             this form: use one rule for both directions",
                        );
                        continue;
                    }
                    (Some(rule), None) => rename_field(&ident, &rule.value()),
                    (None, None) => ident,
                }
            }
        };
        names.push(name);
        // Every name serde reads it under is masked: a foreign producer may write an alias.
        names.extend(field.serde.aliases.iter().map(LitStr::value));
    }
    names
}

/// serde's `rename_all` rule applied to a field name, as serde_derive's
/// `RenameRule::apply_to_field` does (ASCII case changes only; `lowercase` and `snake_case`
/// leave a field name as it is); an unknown rule, which serde reports, leaves it as is.
fn rename_field(field: &str, rule: &str) -> String {
    let pascal = || {
        let mut out = String::new();
        let mut upper = true;
        for c in field.chars() {
            if c == '_' {
                upper = true;
            } else if upper {
                out.push(c.to_ascii_uppercase());
                upper = false;
            } else {
                out.push(c);
            }
        }
        out
    };
    match rule {
        "UPPERCASE" | "SCREAMING_SNAKE_CASE" => field.to_ascii_uppercase(),
        "PascalCase" => pascal(),
        "camelCase" => {
            let p = pascal();
            let mut chars = p.chars();
            match chars.next() {
                Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
                None => p,
            }
        }
        "kebab-case" => field.replace('_', "-"),
        "SCREAMING-KEBAB-CASE" => field.to_ascii_uppercase().replace('_', "-"),
        _ => field.to_owned(),
    }
}
