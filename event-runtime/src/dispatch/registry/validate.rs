//! The checks [`RegistryBuilder::build`](super::RegistryBuilder::build) runs, one step each:
//! collecting the event types, validating each name's versions as an upcast chain, ordering
//! the handlers and checking their names and count, and routing each event to its handlers.

use std::collections::HashMap;

use event_core::{EventDescriptor, HandlerDescriptor};

use super::{RegistryError, TypeIdMap};

/// The event types: those registered, those of the handlers, and, transitively, those they
/// upcast from, each once, in that order; with the index of each by type. Two types that
/// claim the same (name, version) are refused.
pub(super) fn collect_events(
    registered: Vec<EventDescriptor>,
    handlers: &[&'static HandlerDescriptor],
) -> Result<(Vec<EventDescriptor>, TypeIdMap<usize>), RegistryError> {
    let mut events: Vec<EventDescriptor> = Vec::new();
    let mut by_type: TypeIdMap<usize> = TypeIdMap::default();
    let mut queue: Vec<EventDescriptor> = registered
        .into_iter()
        .chain(handlers.iter().flat_map(|h| h.events.iter().map(|e| e())))
        .collect();
    queue.reverse();
    while let Some(e) = queue.pop() {
        if by_type.contains_key(&(e.type_id)()) {
            continue; // the same type registered twice (inventory and by hand)
        }
        if let Some(other) = events
            .iter()
            .find(|o| o.name == e.name && o.version == e.version)
        {
            let (first, second) = ordered(other.type_name, e.type_name);
            return Err(RegistryError::DuplicateEvent {
                name: e.name,
                version: e.version,
                first,
                second,
            });
        }
        // The version it upcasts from is known too: its envelopes decode.
        if let Some(upcaster) = e.upcast_from {
            queue.push((upcaster.from)());
        }
        by_type.insert((e.type_id)(), events.len());
        events.push(e);
    }
    Ok((events, by_type))
}

/// The handlers by priority then name (never by link order), each once; refuses two that
/// share a name and fewer than `expected`.
pub(super) fn order_handlers(
    mut handlers: Vec<&'static HandlerDescriptor>,
    expected: Option<usize>,
) -> Result<Vec<&'static HandlerDescriptor>, RegistryError> {
    handlers.sort_by(|a, b| (a.priority, a.name).cmp(&(b.priority, b.name)));
    handlers.dedup_by(|a, b| std::ptr::eq(*a, *b));
    check_unique_names(&handlers)?;
    if let Some(expected) = expected {
        if handlers.len() < expected {
            return Err(RegistryError::TooFewHandlers {
                expected,
                found: handlers.len(),
                names: handlers
                    .iter()
                    .map(|h| h.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    Ok(handlers)
}

/// Refuses two handlers with one name: handler names are idempotency keys.
fn check_unique_names(handlers: &[&'static HandlerDescriptor]) -> Result<(), RegistryError> {
    let mut by_name: HashMap<&'static str, &'static HandlerDescriptor> = HashMap::new();
    for h in handlers {
        if let Some(other) = by_name.insert(h.name, h) {
            let a = format!("{}:{}", other.file, other.line);
            let b = format!("{}:{}", h.file, h.line);
            let (first, second) = if a <= b { (a, b) } else { (b, a) };
            return Err(RegistryError::DuplicateHandlerName {
                name: h.name,
                first,
                second,
            });
        }
    }
    Ok(())
}

/// Per event: the indices of its handlers, in the handlers' order. A handler must take the
/// newest version of its event (envelopes are upcast, never downcast).
pub(super) fn route_handlers(
    events: &[EventDescriptor],
    by_type: &TypeIdMap<usize>,
    latest: &[u32],
    handlers: &[&'static HandlerDescriptor],
) -> Result<Vec<Vec<u32>>, RegistryError> {
    let mut handlers_of: Vec<Vec<u32>> = vec![Vec::new(); events.len()];
    for (i, h) in handlers.iter().enumerate() {
        // A union handler is routed from each of its variants' events.
        for describe in h.events {
            let event = by_type[&(describe().type_id)()];
            let latest = latest[event] as usize;
            if latest != event {
                let (e, l) = (&events[event], &events[latest]);
                return Err(RegistryError::HandlerTakesOldVersion {
                    handler: h.name,
                    name: e.name,
                    version: e.version,
                    type_name: e.type_name,
                    latest_version: l.version,
                    latest_type: l.type_name,
                });
            }
            if handlers_of[event].last() != Some(&(i as u32)) {
                handlers_of[event].push(i as u32);
            }
        }
    }
    Ok(handlers_of)
}

/// Per event: the newest version of its name, when that is another event with handlers. An
/// older version has no handlers of its own: it is dispatched to those of the newest
/// version, after upcasting.
pub(super) fn upcast_targets(latest: &[u32], handlers_of: &[Vec<u32>]) -> Vec<Option<u32>> {
    (0..latest.len())
        .map(|i| {
            let latest = latest[i];
            (latest as usize != i && !handlers_of[latest as usize].is_empty()).then_some(latest)
        })
        .collect()
}

/// The versions of each event name, validated as chains: every version but the lowest upcasts
/// from the one registered just below it.
pub(super) struct Chains {
    pub(super) versions: HashMap<&'static str, Vec<(u32, usize)>>,
    /// Per event: the event that upcasts from it.
    pub(super) newer: Vec<Option<u32>>,
    /// Per event: the newest version of its name.
    pub(super) latest: Vec<u32>,
}

impl Chains {
    /// Validates the versions of each event name as one chain of upcasts, and finds the
    /// newest version of each.
    pub(super) fn validate(
        events: &[EventDescriptor],
        by_type: &TypeIdMap<usize>,
    ) -> Result<Chains, RegistryError> {
        let mut newer: Vec<Option<u32>> = vec![None; events.len()];
        // Per event: the event it upcasts from.
        let mut older: Vec<Option<usize>> = vec![None; events.len()];
        for (i, e) in events.iter().enumerate() {
            let Some(upcaster) = e.upcast_from else {
                continue;
            };
            let from = (upcaster.from)();
            let f = by_type[&(from.type_id)()];
            if from.name != e.name || from.version >= e.version {
                return Err(RegistryError::InvalidUpcast {
                    name: e.name,
                    version: e.version,
                    type_name: e.type_name,
                    from_name: from.name,
                    from_version: from.version,
                    from_type: from.type_name,
                });
            }
            if let Some(other) = newer[f] {
                let other = &events[other as usize];
                let (first, second) = if other.version < e.version {
                    (other, e)
                } else {
                    (e, other)
                };
                return Err(RegistryError::DuplicateUpcast {
                    name: from.name,
                    from_version: from.version,
                    from_type: from.type_name,
                    first_version: first.version,
                    first: first.type_name,
                    second_version: second.version,
                    second: second.type_name,
                });
            }
            newer[f] = Some(i as u32);
            older[i] = Some(f);
        }

        let mut versions: HashMap<&'static str, Vec<(u32, usize)>> = HashMap::new();
        for (i, e) in events.iter().enumerate() {
            versions.entry(e.name).or_default().push((e.version, i));
        }
        let mut names: Vec<&'static str> = versions.keys().copied().collect();
        names.sort_unstable(); // the first error is the same whatever the link order
        let mut latest: Vec<u32> = (0..events.len() as u32).collect();
        for name in names {
            let chain = versions.get_mut(name).expect("a key of the map");
            chain.sort_unstable();
            // From the newest down: a version that skips one is reported as the gap it is,
            // before the skipped version's own missing upcast.
            for pair in chain.windows(2).rev() {
                let ((_, previous), (_, i)) = (pair[0], pair[1]);
                let (e, p) = (&events[i], &events[previous]);
                match older[i] {
                    Some(f) if f == previous => {}
                    Some(f) => {
                        let from = &events[f];
                        return Err(RegistryError::UpcastGap {
                            name: e.name,
                            version: e.version,
                            type_name: e.type_name,
                            from_version: from.version,
                            from_type: from.type_name,
                            skipped_version: p.version,
                            skipped_type: p.type_name,
                        });
                    }
                    None => {
                        return Err(RegistryError::MissingUpcast {
                            name: e.name,
                            version: e.version,
                            type_name: e.type_name,
                            previous_version: p.version,
                            previous_type: p.type_name,
                        })
                    }
                }
            }
            let newest = chain.last().map_or(0, |&(_, i)| i as u32);
            for &(_, i) in chain.iter() {
                latest[i] = newest;
            }
        }
        Ok(Chains {
            versions,
            newer,
            latest,
        })
    }
}

fn ordered(a: &'static str, b: &'static str) -> (&'static str, &'static str) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}
