//! Parses `#[event(...)]` (on an event and on its fields) and the arguments of
//! `#[event_handler(...)]` with `parse_nested_meta`. It records what was written, with spans;
//! judging the values (name rule, version range, …) is `check`'s job.

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::{
    Attribute, Expr, ExprLit, ExprPath, ExprUnary, Lit, LitStr, Meta, Path, Token, Type, TypePath,
    UnOp,
};

use crate::ctxt::Ctxt;

/// One key of an attribute. Every key goes through [`Attr::set`], so that a duplicate is
/// reported the same way whatever the key.
struct Attr<'c, T> {
    cx: &'c Ctxt,
    key: &'static str,
    seen: bool,
    value: Option<T>,
}

impl<'c, T> Attr<'c, T> {
    fn none(cx: &'c Ctxt, key: &'static str) -> Self {
        Attr {
            cx,
            key,
            seen: false,
            value: None,
        }
    }

    /// Records the key at `path`; `value` is `None` when it was malformed (already reported),
    /// which still counts for the duplicate check.
    fn set(&mut self, path: &Path, value: Option<T>) {
        if self.seen {
            self.cx.error_spanned_by(
                path,
                format_args!("duplicate `{}` key: it is already set above", self.key),
            );
            return;
        }
        self.seen = true;
        self.value = value;
    }

    fn get(self) -> Option<T> {
        self.value
    }
}

/// An integer literal, possibly negated, with the tokens it was written as.
pub(crate) struct Int {
    pub(crate) value: i128,
    pub(crate) tokens: TokenStream,
}

/// `#[event(...)]` on an event type.
pub(crate) struct EventAttrs {
    pub(crate) name: Option<LitStr>,
    pub(crate) version: Option<Int>,
    pub(crate) aggregate: Option<LitStr>,
    /// `upcast_from = OrderPlacedV1`: the previous version of this event.
    pub(crate) upcast_from: Option<Type>,
    /// `deny_unknown_fields`: the path of the key, when given.
    pub(crate) deny_unknown_fields: Option<Path>,
    pub(crate) crate_path: Option<Path>,
    /// An `#[event]` attribute or its `name` did not parse; a missing `name` is then not
    /// reported again.
    pub(crate) malformed: bool,
}

pub(crate) const EVENT_USAGE: &str = "#[event(name = \"context.action\", version = 1)]";

pub(crate) fn event_attrs(cx: &Ctxt, attrs: &[Attribute]) -> EventAttrs {
    let mut name = Attr::none(cx, "name");
    let mut version = Attr::none(cx, "version");
    let mut aggregate = Attr::none(cx, "aggregate");
    let mut upcast_from = Attr::none(cx, "upcast_from");
    let mut deny_unknown_fields = Attr::none(cx, "deny_unknown_fields");
    let mut crate_path = Attr::none(cx, "crate");
    let mut malformed = false;

    for attr in attrs.iter().filter(|attr| attr.path().is_ident("event")) {
        if !require_list(cx, attr, EVENT_USAGE) {
            malformed = true;
            continue;
        }
        let parsed = attr.parse_nested_meta(|meta| {
            let path = &meta.path;
            if path.is_ident("name") {
                name.set(path, string(cx, &meta, "name = \"context.action\"")?);
            } else if path.is_ident("version") {
                version.set(path, integer(cx, &meta, "version = 1")?);
            } else if path.is_ident("aggregate") {
                aggregate.set(path, string(cx, &meta, "aggregate = \"order\"")?);
            } else if path.is_ident("upcast_from") {
                upcast_from.set(path, type_path(cx, &meta, "upcast_from = OrderPlacedV1")?);
            } else if path.is_ident("deny_unknown_fields") {
                let ok = flag(cx, &meta, "deny_unknown_fields")?;
                deny_unknown_fields.set(path, ok.then(|| path.clone()));
            } else if path.is_ident("crate") {
                crate_path.set(path, crate_path_value(cx, &meta)?);
            } else {
                unknown_key(
                    cx,
                    &meta,
                    "`name`, `version`, `aggregate`, `upcast_from`, `deny_unknown_fields` or \
                     `crate`",
                    "event",
                )?;
            }
            Ok(())
        });
        if let Err(error) = parsed {
            cx.syn_error(error);
            malformed = true;
        }
    }

    // A `name` with a malformed value was reported; "missing name" would repeat it.
    malformed |= name.seen && name.value.is_none();
    EventAttrs {
        name: name.get(),
        version: version.get(),
        aggregate: aggregate.get(),
        upcast_from: upcast_from.get(),
        deny_unknown_fields: deny_unknown_fields.get(),
        crate_path: crate_path.get(),
        malformed,
    }
}

/// `#[event(...)]` on a field: the paths of its keys, when given.
#[derive(Default)]
pub(crate) struct FieldAttrs {
    pub(crate) aggregate_id: Option<Path>,
    /// `sensitive`: the field's value is masked wherever the runtime prints an envelope.
    pub(crate) sensitive: Option<Path>,
}

pub(crate) fn field_attrs(cx: &Ctxt, attrs: &[Attribute]) -> FieldAttrs {
    let mut aggregate_id = Attr::none(cx, "aggregate_id");
    let mut sensitive = Attr::none(cx, "sensitive");
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("event")) {
        if !require_list(cx, attr, "#[event(aggregate_id)]` or `#[event(sensitive)]") {
            continue;
        }
        let parsed = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("aggregate_id") {
                // `aggregate_id = …` is reported, and the field still counts as marked.
                flag(cx, &meta, "aggregate_id")?;
                aggregate_id.set(&meta.path, Some(meta.path.clone()));
            } else if meta.path.is_ident("sensitive") {
                flag(cx, &meta, "sensitive")?;
                sensitive.set(&meta.path, Some(meta.path.clone()));
            } else {
                unknown_key(cx, &meta, "`aggregate_id` or `sensitive`", "field")?;
            }
            Ok(())
        });
        if let Err(error) = parsed {
            cx.syn_error(error);
        }
    }
    FieldAttrs {
        aggregate_id: aggregate_id.get(),
        sensitive: sensitive.get(),
    }
}

/// What `#[serde(...)]` says of a name: `rename = "…"` (on a field) or `rename_all = "…"` (on
/// the struct), with the tokens of an unsupported form (`rename(serialize = …)`, `flatten`).
#[derive(Default)]
pub(crate) struct SerdeName {
    pub(crate) rename: Option<LitStr>,
    /// `alias = "…"` (on a field): more names serde reads it under.
    pub(crate) aliases: Vec<LitStr>,
    /// A form the macro cannot follow, with its tokens and why, for the error.
    pub(crate) unsupported: Option<(TokenStream, &'static str)>,
}

const RENAME_PAIR: &str = "`#[event(sensitive)]` needs the one name serde writes and reads: \
     give the field one `rename = \"…\"` (and `alias = \"…\"` for names it also reads), or \
     leave it unmarked";
const FLATTEN: &str = "`#[event(sensitive)]` cannot mark a `#[serde(flatten)]` field: its \
     members are the payload's own fields, under their names; do not flatten it, or leave it \
     unmarked";
const SKIP: &str = "`#[event(sensitive)]` on a field serde skips: it never reaches the \
     payload, so there is nothing to mask; remove one of the two";

/// Reads `key = "…"` (and notes `key(…)` or `flatten`) out of `#[serde(...)]`. Never reports:
/// serde's own derive judges its attribute.
pub(crate) fn serde_name(attrs: &[Attribute], key: &str) -> SerdeName {
    let mut out = SerdeName::default();
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident(key) {
                if meta.input.peek(Token![=]) {
                    out.rename = lit_str(meta.value()?.parse::<Expr>()?);
                } else {
                    let rest = meta.input.parse::<TokenTree>()?;
                    out.unsupported = Some((quote::quote!(#rest), RENAME_PAIR));
                }
            } else if key == "rename" && meta.path.is_ident("alias") {
                out.aliases.extend(lit_str(meta.value()?.parse::<Expr>()?));
            } else if key == "rename" && meta.path.is_ident("flatten") {
                out.unsupported = Some((meta.path.to_token_stream(), FLATTEN));
            } else if key == "rename"
                && (meta.path.is_ident("skip") || meta.path.is_ident("skip_serializing"))
            {
                out.unsupported = Some((meta.path.to_token_stream(), SKIP));
            } else if meta.input.peek(Token![=]) {
                meta.value()?.parse::<Expr>()?;
            } else if meta.input.peek(syn::token::Paren) {
                meta.input.parse::<TokenTree>()?;
            }
            Ok(())
        });
    }
    out
}

/// A string literal, also as a `macro_rules!` argument passes it (in an invisible group).
fn lit_str(expr: Expr) -> Option<LitStr> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Some(lit),
        Expr::Group(group) => lit_str(*group.expr),
        _ => None,
    }
}

/// The arguments of `#[event_handler(...)]`.
pub(crate) struct HandlerAttrs {
    pub(crate) priority: Option<Int>,
    pub(crate) name: Option<LitStr>,
    pub(crate) in_transaction: bool,
    pub(crate) unordered: bool,
    pub(crate) crate_path: Option<Path>,
}

pub(crate) fn handler_attrs(cx: &Ctxt, args: TokenStream) -> HandlerAttrs {
    let mut priority = Attr::none(cx, "priority");
    let mut name = Attr::none(cx, "name");
    let mut in_transaction = Attr::none(cx, "in_transaction");
    let mut unordered = Attr::none(cx, "unordered");
    let mut crate_path = Attr::none(cx, "crate");

    let parser = syn::meta::parser(|meta| {
        let path = &meta.path;
        if path.is_ident("priority") {
            priority.set(path, integer(cx, &meta, "priority = 10")?);
        } else if path.is_ident("name") {
            name.set(
                path,
                string(cx, &meta, "name = \"billing.on_order_placed\"")?,
            );
        } else if path.is_ident("in_transaction") {
            let ok = flag(cx, &meta, "in_transaction")?;
            in_transaction.set(path, ok.then_some(()));
        } else if path.is_ident("unordered") {
            let ok = flag(cx, &meta, "unordered")?;
            unordered.set(path, ok.then_some(()));
        } else if path.is_ident("crate") {
            crate_path.set(path, crate_path_value(cx, &meta)?);
        } else {
            unknown_key(
                cx,
                &meta,
                "`priority`, `name`, `in_transaction`, `unordered` or `crate`",
                "event_handler",
            )?;
        }
        Ok(())
    });
    if let Err(error) = syn::parse::Parser::parse2(parser, args) {
        cx.syn_error(error);
    }

    HandlerAttrs {
        priority: priority.get(),
        name: name.get(),
        in_transaction: in_transaction.get().is_some(),
        unordered: unordered.get().is_some(),
        crate_path: crate_path.get(),
    }
}

/// `#[event]` and `#[event = …]` carry no keys: say what is expected.
fn require_list(cx: &Ctxt, attr: &Attribute, usage: &str) -> bool {
    match &attr.meta {
        Meta::List(_) => true,
        Meta::Path(_) | Meta::NameValue(_) => {
            cx.error_spanned_by(attr, format_args!("expected `{usage}`"));
            false
        }
    }
}

fn unknown_key(cx: &Ctxt, meta: &ParseNestedMeta, expected: &str, what: &str) -> syn::Result<()> {
    let key = meta.path.to_token_stream().to_string().replace(' ', "");
    cx.error_spanned_by(
        &meta.path,
        format_args!("unknown `{what}` key `{key}`: expected {expected}"),
    );
    // Skip the value so that the keys after this one are still read.
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.input.parse::<TokenTree>()?;
    }
    Ok(())
}

/// A key without a value. `Ok(false)` when a value was given (reported).
fn flag(cx: &Ctxt, meta: &ParseNestedMeta, key: &str) -> syn::Result<bool> {
    if meta.input.peek(Token![=]) || meta.input.peek(syn::token::Paren) {
        let value = if meta.input.peek(Token![=]) {
            meta.input.parse::<Token![=]>()?;
            meta.input.parse::<Expr>()?.into_token_stream()
        } else {
            meta.input.parse::<TokenTree>()?.into_token_stream()
        };
        cx.error_spanned_by(
            value,
            format_args!("`{key}` takes no value: write `{key}` alone"),
        );
        return Ok(false);
    }
    Ok(true)
}

/// `key = "…"`. `Ok(None)` when the value is not a string literal (reported).
fn string(cx: &Ctxt, meta: &ParseNestedMeta, usage: &str) -> syn::Result<Option<LitStr>> {
    let expr: Expr = meta.value()?.parse()?;
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(Some(lit)),
        other => {
            cx.error_spanned_by(other, format_args!("expected a string literal: `{usage}`"));
            Ok(None)
        }
    }
}

/// `key = 10` or `key = -10`. `Ok(None)` when the value is not an integer literal (reported).
fn integer(cx: &Ctxt, meta: &ParseNestedMeta, usage: &str) -> syn::Result<Option<Int>> {
    let expr: Expr = meta.value()?.parse()?;
    let (negative, lit) = match &expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => (false, lit),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr: inner,
            ..
        }) => match &**inner {
            Expr::Lit(ExprLit {
                lit: Lit::Int(lit), ..
            }) => (true, lit),
            _ => return not_an_integer(cx, &expr, usage),
        },
        _ => return not_an_integer(cx, &expr, usage),
    };
    match lit.base10_parse::<u64>() {
        Ok(magnitude) => {
            let magnitude = i128::from(magnitude);
            Ok(Some(Int {
                value: if negative { -magnitude } else { magnitude },
                tokens: expr.into_token_stream(),
            }))
        }
        Err(error) => {
            cx.syn_error(error);
            Ok(None)
        }
    }
}

fn not_an_integer(cx: &Ctxt, expr: &Expr, usage: &str) -> syn::Result<Option<Int>> {
    cx.error_spanned_by(expr, format_args!("expected an integer literal: `{usage}`"));
    Ok(None)
}

/// `key = path::to::Type`. `Ok(None)` when the value is not a path (reported).
fn type_path(cx: &Ctxt, meta: &ParseNestedMeta, usage: &str) -> syn::Result<Option<Type>> {
    let expr: Expr = meta.value()?.parse()?;
    match expr {
        Expr::Path(ExprPath {
            attrs, qself, path, ..
        }) if attrs.is_empty() => Ok(Some(Type::Path(TypePath { attrs, qself, path }))),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => {
            cx.error_spanned_by(
                &lit,
                format_args!("expected a type, not a string: `{usage}`"),
            );
            Ok(None)
        }
        other => {
            cx.error_spanned_by(
                other,
                format_args!("expected the type of the previous version of this event: `{usage}`"),
            );
            Ok(None)
        }
    }
}

/// `crate = path::to::event_core`, or the same path in a string as serde writes it.
pub(crate) fn crate_path_value(cx: &Ctxt, meta: &ParseNestedMeta) -> syn::Result<Option<Path>> {
    let expr: Expr = meta.value()?.parse()?;
    match expr {
        Expr::Path(expr) if expr.qself.is_none() && expr.attrs.is_empty() => Ok(Some(expr.path)),
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => match lit.parse::<Path>() {
            Ok(path) => Ok(Some(path)),
            Err(error) => {
                cx.syn_error(error);
                Ok(None)
            }
        },
        other => {
            cx.error_spanned_by(
                other,
                "expected a path to the `event_core` crate: `crate = my_facade::event_core`",
            );
            Ok(None)
        }
    }
}
