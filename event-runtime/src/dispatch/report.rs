//! What a dispatch reports: per handler, whether it ran, was skipped as a duplicate, failed or
//! panicked. Plain data, no behaviour; it must stay small, because every dispatch returns one.
//!
//! A report is three bitmasks over the event's handlers (positions in the order they run) and
//! a pointer to their names, shared by every report of the event. Only a failure's error, and
//! the outcomes of handlers past the 64th of one event, are stored out of line, so the success
//! path never allocates and a report is a few words to move.

use std::fmt;
use std::sync::Mutex;

use event_core::HandlerError;
use uuid::Uuid;

/// What happened to one handler of one event.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and succeeded.
    Ran,
    /// Skipped: the idempotency guard has seen (handler, event id) already.
    Duplicate,
    /// The handler returned an error. Not marked in the guard, so a retry runs it again.
    Failed(HandlerError),
    /// The handler panicked; the message is the panic payload. Treated as a failure.
    Panicked(PanicMessage),
}

/// What a report hands out for handlers whose outcome is only a bit.
static RAN: Outcome = Outcome::Ran;
static DUPLICATE: Outcome = Outcome::Duplicate;

/// The message of a handler's panic (the `&str` or `String` payload of `panic!`).
#[derive(Debug, Clone, PartialEq, Eq)]
// One pointer rather than `String`'s three, so that `Outcome` stays small; the extra
// allocation is paid only when a handler panics.
#[allow(clippy::box_collection)]
pub struct PanicMessage(Box<String>);

impl PanicMessage {
    pub(crate) fn new(message: String) -> Self {
        PanicMessage(Box::new(message))
    }

    /// The message.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PanicMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for PanicMessage {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Outcome {
    /// `true` for [`Outcome::Failed`] and [`Outcome::Panicked`].
    pub fn is_failure(&self) -> bool {
        matches!(self, Outcome::Failed(_) | Outcome::Panicked(_))
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ran => f.write_str("ran"),
            Outcome::Duplicate => f.write_str("skipped as duplicate"),
            Outcome::Failed(e) => write!(f, "failed: {e}"),
            Outcome::Panicked(m) => write!(f, "panicked: {m}"),
        }
    }
}

/// One handler's outcome, borrowed from a [`DispatchReport`] (see
/// [`DispatchReport::outcomes`]).
#[derive(Debug, Clone, Copy)]
pub struct HandlerOutcome<'a> {
    /// The handler name (its idempotency key).
    pub handler: &'static str,
    /// What happened.
    pub outcome: &'a Outcome,
}

/// The names of one event's handlers in the order a dispatch runs them; a report's bit `i`
/// is the handler named `names[i]`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HandlerNames {
    names: &'static [&'static str],
}

static NO_HANDLERS: HandlerNames = HandlerNames { names: &[] };

impl HandlerNames {
    /// The shared list for `names`. Reports outlive the dispatcher that made them and must
    /// not pay a reference count per dispatch, so the lists are `'static`: each distinct list
    /// is leaked once, and later dispatchers with the same handlers reuse it. Memory is bounded
    /// by the program's handler combinations, not by how many dispatchers it builds.
    pub(crate) fn intern(names: &[&'static str]) -> &'static HandlerNames {
        static INTERNED: Mutex<Vec<&'static HandlerNames>> = Mutex::new(Vec::new());
        if names.is_empty() {
            return &NO_HANDLERS;
        }
        let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&found) = interned.iter().find(|n| n.names == names) {
            return found;
        }
        let leaked: &'static HandlerNames = Box::leak(Box::new(HandlerNames {
            names: Box::leak(names.to_vec().into_boxed_slice()),
        }));
        interned.push(leaked);
        leaked
    }

    pub(crate) fn empty() -> &'static HandlerNames {
        &NO_HANDLERS
    }

    fn name(&self, position: u32) -> &'static str {
        self.names[position as usize]
    }

    fn position(&self, handler: &str) -> Option<u32> {
        self.names
            .iter()
            .position(|&n| n == handler)
            .map(|p| p as u32)
    }
}

/// Positions below this are bits in the masks; the rest are stored out of line.
const INLINE: u32 = u64::BITS;

/// The outcome of dispatching one event: what happened to each handler that this dispatch
/// ran or skipped, in the order they ran.
///
/// Small and owned (64 bytes, no allocation unless a handler failed): successes and
/// duplicates are bits, and a failed handler's error is kept out of line. Ask it what you
/// need: [`is_success`](Self::is_success) or the counts for the common case,
/// [`failed`](Self::failed) for the errors, [`outcome`](Self::outcome) for one handler,
/// [`outcomes`](Self::outcomes) for all of them.
///
/// ```
/// # use event_core::{event_handler, DomainEvent, Envelope, HandlerError};
/// # use event_runtime::{Dispatcher, Outcome};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, DomainEvent)]
/// # #[event(name = "invoice.sent", version = 1)]
/// # struct Sent { #[event(aggregate_id)] invoice: u64 }
/// #[event_handler(name = "archive")]
/// fn archive(_: &Sent) {}
///
/// #[event_handler(name = "mail", priority = 1)]
/// fn mail(_: &Sent) -> Result<(), HandlerError> {
///     Err(HandlerError::transient_msg("smtp server unavailable"))
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let dispatcher = Dispatcher::builder_empty()
///     .handler::<archive>()
///     .handler::<mail>()
///     .build()?;
/// let report = dispatcher.dispatch(&Envelope::new(Sent { invoice: 1 })).await;
/// assert!(!report.is_success());
/// assert_eq!((report.ran(), report.failures()), (1, 1));
/// for failed in report.failed() {
///     println!("{} {}", failed.handler, failed.outcome); // mail failed: smtp server unavailable
/// }
/// assert!(matches!(report.outcome("mail"), Some(Outcome::Failed(e)) if e.is_transient()));
/// let names: Vec<_> = report.outcomes().iter().map(|o| o.handler).collect();
/// assert_eq!(names, ["archive", "mail"]);
/// # Ok::<(), event_runtime::RegistryError>(())
/// # }).unwrap();
/// ```
pub struct DispatchReport {
    event_id: Uuid,
    event_name: &'static str,
    handlers: &'static HandlerNames,
    /// Bit `i`: handler `i` ran and succeeded.
    ran: u64,
    /// Bit `i`: handler `i` was skipped as a duplicate.
    duplicates: u64,
    /// Every failure, and every outcome at a position of [`INLINE`] or more.
    spill: Option<Box<Spill>>,
}

/// Outcomes by position, ascending.
struct Spill {
    outcomes: Vec<(u32, Outcome)>,
}

/// A report being filled in by a dispatch. Its parts travel by value, never by reference (the
/// cold path takes the out-of-line part and gives it back), so that the compiler keeps the
/// masks in registers rather than in memory that the report is then copied from.
#[derive(Default)]
pub(crate) struct Tally {
    ran: u64,
    duplicates: u64,
    spill: Option<Box<Spill>>,
}

impl Tally {
    /// Records that the handler at `position` ran and succeeded.
    #[inline(always)]
    pub(crate) fn ran(&mut self, position: u32) {
        if position < INLINE {
            self.ran |= 1 << position;
        } else {
            self.spill = push_spill(self.spill.take(), position, Outcome::Ran);
        }
    }

    /// Records that the handler at `position` was skipped as a duplicate.
    #[inline(always)]
    pub(crate) fn duplicate(&mut self, position: u32) {
        if position < INLINE {
            self.duplicates |= 1 << position;
        } else {
            self.spill = push_spill(self.spill.take(), position, Outcome::Duplicate);
        }
    }

    /// Records a failure or a panic (or any outcome). Positions are recorded in increasing
    /// order.
    #[inline]
    pub(crate) fn record(&mut self, position: u32, outcome: Outcome) {
        match outcome {
            Outcome::Ran => self.ran(position),
            Outcome::Duplicate => self.duplicate(position),
            failure => self.spill = push_spill(self.spill.take(), position, failure),
        }
    }

    /// The report of event `event_id` named `event_name`, whose handlers are `handlers`.
    #[inline(always)]
    pub(crate) fn report(
        self,
        event_id: Uuid,
        event_name: &'static str,
        handlers: &'static HandlerNames,
    ) -> DispatchReport {
        DispatchReport {
            event_id,
            event_name,
            handlers,
            ran: self.ran,
            duplicates: self.duplicates,
            spill: self.spill,
        }
    }
}

#[cold]
#[inline(never)]
fn push_spill(spill: Option<Box<Spill>>, position: u32, outcome: Outcome) -> Option<Box<Spill>> {
    let mut spill = spill.unwrap_or_else(|| {
        Box::new(Spill {
            outcomes: Vec::new(),
        })
    });
    debug_assert!(spill.outcomes.last().is_none_or(|(p, _)| *p < position));
    spill.outcomes.push((position, outcome));
    Some(spill)
}

impl DispatchReport {
    #[inline]
    pub(crate) fn new(
        event_id: Uuid,
        event_name: &'static str,
        handlers: &'static HandlerNames,
    ) -> Self {
        Tally::default().report(event_id, event_name, handlers)
    }

    /// The event id.
    pub fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// The event name.
    pub fn event_name(&self) -> &'static str {
        self.event_name
    }

    /// Every handler's outcome, in the order they ran. Handlers this dispatch did not run
    /// (the other phase of a unit of work) are not in it.
    pub fn outcomes(&self) -> Outcomes<'_> {
        Outcomes { report: self }
    }

    /// The outcome of the handler named `handler`; `None` when it is not in this report.
    pub fn outcome(&self, handler: &str) -> Option<&Outcome> {
        let position = self.handlers.position(handler)?;
        if position < INLINE {
            let bit = 1 << position;
            if self.ran & bit != 0 {
                return Some(&RAN);
            }
            if self.duplicates & bit != 0 {
                return Some(&DUPLICATE);
            }
        }
        let spill = self.spilled();
        let i = spill.binary_search_by_key(&position, |(p, _)| *p).ok()?;
        Some(&spill[i].1)
    }

    /// How many handlers ran and succeeded.
    pub fn ran(&self) -> usize {
        self.ran.count_ones() as usize + self.count_spilled(|o| matches!(o, Outcome::Ran))
    }

    /// How many handlers were skipped as duplicates.
    pub fn duplicates(&self) -> usize {
        self.duplicates.count_ones() as usize
            + self.count_spilled(|o| matches!(o, Outcome::Duplicate))
    }

    /// How many handlers failed or panicked.
    pub fn failures(&self) -> usize {
        self.count_spilled(Outcome::is_failure)
    }

    /// `true` when no handler failed or panicked.
    pub fn is_success(&self) -> bool {
        self.failures() == 0
    }

    /// The failed and panicked handlers with their outcomes, in the order they ran.
    pub fn failed(&self) -> impl Iterator<Item = HandlerOutcome<'_>> {
        self.spilled()
            .iter()
            .filter(|(_, o)| o.is_failure())
            .map(|(p, o)| self.entry(*p, o))
    }

    fn spilled(&self) -> &[(u32, Outcome)] {
        self.spill.as_deref().map_or(&[], |s| &s.outcomes)
    }

    fn count_spilled(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.spilled().iter().filter(|(_, o)| f(o)).count()
    }

    fn entry<'a>(&self, position: u32, outcome: &'a Outcome) -> HandlerOutcome<'a> {
        HandlerOutcome {
            handler: self.handlers.name(position),
            outcome,
        }
    }

    /// Adds the outcomes of another phase of the same event (same handler list, other
    /// positions).
    pub(crate) fn merge(&mut self, other: DispatchReport) {
        debug_assert!(std::ptr::eq(self.handlers, other.handlers) || other.is_empty());
        self.ran |= other.ran;
        self.duplicates |= other.duplicates;
        if let Some(theirs) = other.spill {
            match &mut self.spill {
                None => self.spill = Some(theirs),
                Some(ours) => {
                    ours.outcomes.extend(theirs.outcomes);
                    ours.outcomes.sort_by_key(|(p, _)| *p);
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        (self.ran | self.duplicates) == 0 && self.spill.is_none()
    }

    /// Removes and returns the first failure (in run order): its handler and outcome.
    pub(crate) fn take_first_failure(&mut self) -> Option<(&'static str, Outcome)> {
        let spill = self.spill.as_mut()?;
        let i = spill.outcomes.iter().position(|(_, o)| o.is_failure())?;
        let (position, outcome) = spill.outcomes.remove(i);
        Some((self.handlers.name(position), outcome))
    }
}

impl fmt::Debug for DispatchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DispatchReport")
            .field("event_id", &self.event_id)
            .field("event_name", &self.event_name)
            .field("outcomes", &self.outcomes())
            .finish()
    }
}

impl fmt::Display for DispatchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:", self.event_name, self.event_id)?;
        for o in self.outcomes() {
            write!(f, " {} {};", o.handler, o.outcome)?;
        }
        Ok(())
    }
}

/// The outcomes in a [`DispatchReport`], in the order the handlers ran: a view, like a slice
/// of [`HandlerOutcome`]s (`len`, `is_empty`, `iter`, `for o in report.outcomes()`).
#[derive(Clone, Copy)]
pub struct Outcomes<'a> {
    report: &'a DispatchReport,
}

impl<'a> Outcomes<'a> {
    /// How many handlers are in the report.
    pub fn len(&self) -> usize {
        self.iter().len()
    }

    /// `true` when no handler ran or was skipped (an event without handlers, or none in this
    /// phase).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Iterates over the outcomes, in the order the handlers ran.
    pub fn iter(&self) -> OutcomesIter<'a> {
        let r = self.report;
        OutcomesIter {
            report: r,
            bits: r.ran | r.duplicates,
            spilled: r.spilled(),
        }
    }
}

impl fmt::Debug for Outcomes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for Outcomes<'a> {
    type Item = HandlerOutcome<'a>;
    type IntoIter = OutcomesIter<'a>;
    fn into_iter(self) -> OutcomesIter<'a> {
        self.iter()
    }
}

impl<'a> IntoIterator for &Outcomes<'a> {
    type Item = HandlerOutcome<'a>;
    type IntoIter = OutcomesIter<'a>;
    fn into_iter(self) -> OutcomesIter<'a> {
        self.iter()
    }
}

/// Iterator over a report's [`Outcomes`], in the order the handlers ran.
#[derive(Debug, Clone)]
pub struct OutcomesIter<'a> {
    report: &'a DispatchReport,
    /// Positions of successes and duplicates not yet yielded.
    bits: u64,
    /// Spilled outcomes not yet yielded.
    spilled: &'a [(u32, Outcome)],
}

impl<'a> Iterator for OutcomesIter<'a> {
    type Item = HandlerOutcome<'a>;

    fn next(&mut self) -> Option<HandlerOutcome<'a>> {
        let r = self.report;
        // The lower of the next bit and the next spilled position goes first.
        let bit = if self.bits == 0 {
            u32::MAX
        } else {
            self.bits.trailing_zeros()
        };
        match self.spilled.split_first() {
            Some(((p, o), rest)) if *p < bit => {
                self.spilled = rest;
                Some(r.entry(*p, o))
            }
            _ if self.bits != 0 => {
                self.bits &= self.bits - 1;
                let outcome = if r.ran & (1 << bit) != 0 {
                    &RAN
                } else {
                    &DUPLICATE
                };
                Some(r.entry(bit, outcome))
            }
            _ => None,
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.bits.count_ones() as usize + self.spilled.len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for OutcomesIter<'_> {}

impl std::iter::FusedIterator for OutcomesIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// One dispatch returns one report by value: keep it small (no allocation, a few words
    /// moved) — see the `dispatch` benchmark.
    #[test]
    fn reports_stay_small() {
        assert_eq!(std::mem::size_of::<Outcome>(), 16);
        assert_eq!(std::mem::size_of::<DispatchReport>(), 64);
    }

    fn names(n: usize) -> &'static HandlerNames {
        let names: Vec<&'static str> = (0..n)
            .map(|i| &*Box::leak(format!("h{i}").into_boxed_str()))
            .collect();
        HandlerNames::intern(&names)
    }

    fn failure(m: &str) -> Outcome {
        Outcome::Failed(HandlerError::permanent_msg(m))
    }

    #[test]
    fn lists_are_interned() {
        let a = HandlerNames::intern(&["x", "y"]);
        let b = HandlerNames::intern(&["x", "y"]);
        assert!(std::ptr::eq(a, b));
        assert!(!std::ptr::eq(a, HandlerNames::intern(&["y", "x"])));
        assert!(std::ptr::eq(
            HandlerNames::intern(&[]),
            HandlerNames::empty()
        ));
    }

    /// Every kind of outcome below and above the 64 inline positions reads back in order,
    /// with the right counts.
    #[test]
    fn outcomes_past_the_inline_bits_are_kept_in_order() {
        let mut t = Tally::default();
        let expected: Vec<(u32, &str)> = (0..70)
            .filter(|p| p % 5 != 4) // not in this report
            .map(|p| {
                let kind = ["ran", "duplicate", "failed", "panicked"][(p % 5) as usize];
                (p, kind)
            })
            .collect();
        for &(p, kind) in &expected {
            match kind {
                "ran" => t.ran(p),
                "duplicate" => t.duplicate(p),
                "failed" => t.record(p, failure(&format!("f{p}"))),
                _ => t.record(p, Outcome::Panicked(PanicMessage::new(format!("p{p}")))),
            }
        }
        let mut r = t.report(Uuid::nil(), "e", names(70));
        let got: Vec<(String, String)> = r
            .outcomes()
            .iter()
            .map(|o| (o.handler.to_owned(), o.outcome.to_string()))
            .collect();
        let want: Vec<(String, String)> = expected
            .iter()
            .map(|&(p, kind)| {
                let shown = match kind {
                    "ran" => "ran".to_owned(),
                    "duplicate" => "skipped as duplicate".to_owned(),
                    "failed" => format!("failed: permanent error: f{p}"),
                    _ => format!("panicked: p{p}"),
                };
                (format!("h{p}"), shown)
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(r.outcomes().len(), expected.len());
        assert_eq!(r.outcomes().iter().len(), expected.len());
        assert_eq!(r.ran(), 14);
        assert_eq!(r.duplicates(), 14);
        assert_eq!(r.failures(), 28);
        assert_eq!(r.failed().count(), 28);
        assert!(matches!(r.outcome("h65"), Some(Outcome::Ran)));
        assert!(matches!(r.outcome("h66"), Some(Outcome::Duplicate)));
        assert!(matches!(r.outcome("h67"), Some(Outcome::Failed(_))));
        assert!(matches!(r.outcome("h2"), Some(Outcome::Failed(_))));
        assert!(r.outcome("h4").is_none());
        assert!(r.outcome("h69").is_none());
        assert!(r.outcome("nope").is_none());

        let (handler, first) = r.take_first_failure().unwrap();
        assert_eq!(
            (handler, first.to_string().as_str()),
            ("h2", "failed: permanent error: f2")
        );
        assert_eq!(r.failures(), 27);
        assert!(r.outcome("h2").is_none());
        assert_eq!(r.outcomes().len(), expected.len() - 1);
    }

    #[test]
    fn phases_merge_into_one_report() {
        let list = names(3);
        let mut first = Tally::default();
        first.record(0, failure("no"));
        let mut first = first.report(Uuid::nil(), "e", list);
        let mut second = Tally::default();
        second.ran(1);
        second.record(2, failure("later"));
        first.merge(second.report(Uuid::nil(), "e", list));
        let shown: Vec<_> = first.outcomes().iter().map(|o| o.handler).collect();
        assert_eq!(shown, ["h0", "h1", "h2"]);
        assert_eq!((first.ran(), first.failures()), (1, 2));
        assert_eq!(
            first.to_string(),
            "e 00000000-0000-0000-0000-000000000000: h0 failed: permanent error: no; h1 ran; \
             h2 failed: permanent error: later;"
        );
    }

    #[test]
    fn an_empty_report_is_a_success() {
        let r = DispatchReport::new(Uuid::nil(), "e", HandlerNames::empty());
        assert!(r.is_success() && r.outcomes().is_empty());
        assert_eq!(r.failed().count(), 0);
        assert_eq!(
            format!("{r:?}"),
            "DispatchReport { event_id: 00000000-0000-0000-0000-000000000000, event_name: \"e\", outcomes: [] }"
        );
    }
}
