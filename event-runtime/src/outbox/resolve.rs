//! Resolving an outbox's destinations when it is built: each one's settings (the
//! application's options, else the destination's own, else the outbox's), its circuit
//! breaker, the checks across them, and the routes commit writes.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use event_core::DeliveryMode;
use tokio::sync::Semaphore;

use super::destination::{Resolved, Target};
use super::retry::RetryPolicy;
use super::{CircuitBreaker, ConfigError, Destination, HandlerOptions, OutboxConfig};
use crate::dispatch::{Dispatcher, Registry};
use crate::store::backend::Route;

/// What [`OutboxBuilder::build`](super::OutboxBuilder::build) resolves the destinations
/// from: the outbox's configuration, the application's options by destination name, and the
/// transports' destinations.
pub(super) struct Resolver<'a> {
    pub(super) config: &'a OutboxConfig,
    pub(super) options: &'a HashMap<String, HandlerOptions>,
    pub(super) external: &'a [Arc<dyn Destination>],
}

impl Resolver<'_> {
    /// Every destination, by name: the after-commit handlers, then the transports'
    /// destinations, whose names must not be taken already.
    pub(super) fn destinations(
        &self,
        dispatcher: &Dispatcher,
    ) -> Result<HashMap<String, Arc<Resolved>>, ConfigError> {
        let mut destinations: HashMap<String, Arc<Resolved>> = HashMap::new();
        for (i, h) in dispatcher.registry().handlers().iter().enumerate() {
            if h.mode != DeliveryMode::AfterCommit {
                continue;
            }
            let target = Target::Handler {
                index: i as u32,
                transactional: h.transaction.is_some(),
            };
            destinations.insert(
                h.name.to_owned(),
                self.resolve(h.name, target, HandlerOptions::new())?,
            );
        }
        for d in self.external {
            let name = d.name().to_owned();
            if destinations.contains_key(&name) || dispatcher.handler_index(&name).is_some() {
                return Err(ConfigError::DuplicateDestination(name));
            }
            let own = HandlerOptions {
                retry: d.retry_policy(),
                timeout: d.timeout(),
                concurrency: d.concurrency(),
                ..HandlerOptions::new()
            };
            let r = self.resolve(&name, Target::External(Arc::clone(d)), own)?;
            destinations.insert(name, r);
        }
        Ok(destinations)
    }

    /// One destination's settings, checked: each from the application's options for `name`,
    /// else from the destination's `own`, else from the outbox's configuration.
    fn resolve(
        &self,
        name: &str,
        target: Target,
        own: HandlerOptions,
    ) -> Result<Arc<Resolved>, ConfigError> {
        let c = self.config;
        let o = self.options.get(name).copied().unwrap_or_default();
        let retry = o.retry.or(own.retry).unwrap_or(c.retry);
        let timeout = o.timeout.or(own.timeout).unwrap_or(c.handler_timeout);
        let concurrency = o.concurrency.or(own.concurrency).unwrap_or(c.concurrency);
        check_limits(name, &retry, timeout, concurrency)?;
        let breaker = self.circuit_breaker(name, &target, &o)?;
        Ok(Arc::new(Resolved {
            name: name.to_owned(),
            target,
            retry,
            timeout,
            permits: Arc::new(Semaphore::new(concurrency)),
            breaker,
        }))
    }

    /// The circuit breaker of destination `name`: its own, else the outbox's, unless it opts
    /// out. A relay has none, and may not be given one.
    fn circuit_breaker(
        &self,
        name: &str,
        target: &Target,
        o: &HandlerOptions,
    ) -> Result<Option<CircuitBreaker>, ConfigError> {
        let is_relay = matches!(target, Target::External(_));
        if is_relay && o.circuit_breaker.is_some() {
            return Err(ConfigError::BreakerOnRelay(name.to_owned()));
        }
        if o.circuit_breaker.is_some() && o.no_circuit_breaker {
            return Err(ConfigError::CircuitBreaker {
                of: format!("`{name}`"),
                field: "no_circuit_breaker",
                rule: "is set beside circuit_breaker: give the handler one or the other",
            });
        }
        let breaker = (!is_relay && !o.no_circuit_breaker)
            .then_some(o.circuit_breaker.or(self.config.circuit_breaker))
            .flatten();
        if let Some((field, rule)) = breaker.and_then(|b| b.invalid()) {
            return Err(ConfigError::CircuitBreaker {
                of: format!("`{name}`"),
                field,
                rule,
            });
        }
        Ok(breaker)
    }

    /// Refuses options for a destination that does not exist, an outbox retry policy that
    /// never attempts, and a retention not longer than the longest retry horizon.
    pub(super) fn check(
        &self,
        destinations: &HashMap<String, Arc<Resolved>>,
    ) -> Result<(), ConfigError> {
        if let Some(unknown) = self.options.keys().find(|n| !destinations.contains_key(*n)) {
            return Err(ConfigError::UnknownDestination(unknown.clone()));
        }
        let c = self.config;
        if c.retry.max_attempts == 0 {
            return Err(ConfigError::ZeroAttempts("the outbox".into()));
        }
        let horizon = destinations
            .values()
            .map(|d| d.retry.horizon())
            .chain(std::iter::once(c.retry.horizon()))
            .max()
            .unwrap_or_default();
        if c.retention <= horizon {
            return Err(ConfigError::RetentionTooShort {
                retention: c.retention,
                horizon,
            });
        }
        Ok(())
    }

    /// The destinations of each event type, as commit writes them: its after-commit
    /// handlers, then the transports' destinations that route it.
    pub(super) fn routes(&self, registry: &Registry) -> HashMap<TypeId, Vec<Route>> {
        let mut routes: HashMap<TypeId, Vec<Route>> = HashMap::new();
        for event in registry.events() {
            let mut r: Vec<Route> = registry
                .handlers_for((event.type_id)())
                .filter(|h| h.mode == DeliveryMode::AfterCommit)
                .map(|h| Route {
                    destination: h.name.to_owned(),
                    ordered: h.ordered,
                })
                .collect();
            for d in self.external {
                if let Some(routing) = d.route(event) {
                    r.push(Route {
                        destination: d.name().to_owned(),
                        ordered: routing.ordered,
                    });
                }
            }
            routes.insert((event.type_id)(), r);
        }
        routes
    }
}

/// Refuses a destination that could never run: no attempt, no time, or no concurrency.
fn check_limits(
    name: &str,
    retry: &RetryPolicy,
    timeout: Duration,
    concurrency: usize,
) -> Result<(), ConfigError> {
    if retry.max_attempts == 0 {
        return Err(ConfigError::ZeroAttempts(format!("`{name}`")));
    }
    for (field, zero) in [
        ("timeout", timeout.is_zero()),
        ("concurrency", concurrency == 0),
    ] {
        if zero {
            return Err(ConfigError::DestinationNotPositive {
                destination: name.to_owned(),
                field,
            });
        }
    }
    Ok(())
}
