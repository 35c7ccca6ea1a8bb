//! `dlq replay` and `dlq purge`: selecting dead letters, confirming, progress, and who the
//! actor is. Changes dead letters only through one audited store operation: must not write rows.

use std::io;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::store::{AuditEntry, DeadLetterFilter, Resolution, RESOLVE_PAGE};

use super::args::ResolveArgs;
use super::connect::Target;
use super::dlq::check_names;
use super::format::{audit_line, join_ids, time};
use super::{App, CliError, Io};

/// More rows than this show a progress bar (on a terminal).
const PROGRESS_THRESHOLD: usize = 50;

pub(super) async fn resolve(
    target: &Target<'_>,
    app: &App<'_>,
    action: Resolution,
    args: ResolveArgs,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let (verb, doing, done) = match action {
        Resolution::Replay => ("replay", "replaying", "replayed"),
        Resolution::Purge => ("purge", "purging", "purged"),
    };
    let reason = args.reason.trim();
    if reason.is_empty() {
        return Err(CliError::Refused(format!(
            "--reason must say why: it is written to the audit log; nothing was {done}"
        )));
    }
    let actor = actor(args.actor.as_deref(), done)?;
    let store = target.connect().await?;

    if args.ids.is_empty() {
        let filter = DeadLetterFilter {
            handler: args.handler.clone(),
            event_name: args.event.clone(),
            ..DeadLetterFilter::default()
        };
        let total = store.count_dead_letters(&filter).await?;
        if total == 0 {
            check_names(&store, app, args.handler.as_deref(), args.event.as_deref()).await?;
            writeln!(io.out, "no open dead letters match; nothing {done}")?;
            return Ok(());
        }
        if !args.yes {
            let selection = selection(&args);
            let question = format!("{verb} {total} dead letters ({selection})?");
            if !confirm(&question, io)? {
                return Err(CliError::Refused(if io.prompt {
                    format!("not confirmed; nothing was {done}")
                } else {
                    format!("{question} Pass --yes to confirm; nothing was {done}")
                }));
            }
        }
        let bar = bar(io, total, doing);
        let ticker = bar.clone();
        let entry = store
            .resolve_matching(&filter, action, &actor, reason, move |n| {
                if let Some(bar) = &ticker {
                    bar.set_position(n);
                }
            })
            .await;
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let entry = entry.map_err(|e| interrupted(e, doing))?;
        // A replay leaves a transport inbox's dead letters open (they have no delivery): the
        // application's inbox core replays them, when the application gave its outbox.
        let inbox = match action {
            Resolution::Replay => {
                replay_inbox_matching(&store, app, &filter, &actor, reason, io).await?
            }
            Resolution::Purge => 0,
        };
        return report_matching(&entry, total.saturating_sub(inbox), done, io);
    }

    let mut ids = args.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    let mut open = Vec::with_capacity(ids.len());
    let mut received = Vec::new();
    let mut missing = Vec::new();
    for id in ids {
        match store.dead_letter_by_id(id).await? {
            None => missing.push(id),
            Some(d) if d.resolved_at.is_some() => {
                writeln!(
                    io.err,
                    "warning: dead letter {id} was already {} at {}; skipped",
                    d.resolution.as_deref().unwrap_or("resolved"),
                    d.resolved_at.map(time).unwrap_or_default()
                )?;
            }
            // A received message has no delivery to replay: the application's inbox core
            // decodes it and commits it again, when the application gave its outbox.
            Some(d) if action == Resolution::Replay && d.origin.is_some() => received.push(id),
            Some(_) => open.push(id),
        }
    }
    if !missing.is_empty() {
        return Err(CliError::NotFound(missing));
    }
    if !received.is_empty() {
        replay_received(&store, app, &received, &actor, reason, io).await?;
        if open.is_empty() {
            return Ok(());
        }
    }
    if open.is_empty() {
        writeln!(
            io.out,
            "nothing {done}: no open dead letter among those ids"
        )?;
        return Ok(());
    }
    let ids = open;

    let bar = bar(io, ids.len() as u64, doing);
    let ticker = bar.clone();
    let entry = store
        .resolve_dead_letters_with_progress(&ids, action, &actor, reason, move |n| {
            if let Some(bar) = &ticker {
                bar.set_position(n as u64);
            }
        })
        .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let entry = entry?;
    let skipped = ids.len() - entry.dead_letter_ids.len();
    writeln!(
        io.out,
        "{done} {} dead letter{}: {}",
        entry.count,
        if entry.count == 1 { "" } else { "s" },
        join_ids(&entry.dead_letter_ids, 20)
    )?;
    if skipped > 0 {
        writeln!(
            io.out,
            "skipped {skipped} that another operation resolved in the meantime"
        )?;
    }
    audit_line(&entry, io)
}

/// `dlq resume AUDIT_ID`: finishes a replay or purge over a selection that was interrupted.
pub(super) async fn resume(
    target: &Target<'_>,
    audit_id: i64,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let store = target.connect().await?;
    let bar = bar(io, 0, "resuming");
    let ticker = bar.clone();
    let entry = store
        .resume_resolution(audit_id, move |n| {
            if let Some(bar) = &ticker {
                bar.set_position(n);
            }
        })
        .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let entry = entry.map_err(|e| interrupted(e, "resuming"))?;
    let done = if entry.action == "purge" {
        "purged"
    } else {
        "replayed"
    };
    writeln!(
        io.out,
        "{done} {} dead letter{} in all",
        entry.count,
        if entry.count == 1 { "" } else { "s" }
    )?;
    audit_line(&entry, io)
}

/// A progress bar on standard error for more than [`PROGRESS_THRESHOLD`] rows (`total` 0:
/// unknown), only on a terminal.
fn bar(io: &Io<'_>, total: u64, doing: &str) -> Option<ProgressBar> {
    if !io.progress || (total > 0 && total <= PROGRESS_THRESHOLD as u64) {
        return None;
    }
    let (template, len) = if total > 0 {
        ("{msg} [{bar:40}] {pos}/{len} ({eta})", Some(total))
    } else {
        ("{msg} {pos} {spinner}", None)
    };
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
    bar.set_style(style);
    bar.set_message(doing.to_owned());
    Some(bar)
}

/// A failed operation over a selection says how to finish it (an audit id that names no such
/// operation is just that: nothing ran).
fn interrupted(e: crate::store::StoreError, doing: &str) -> CliError {
    if matches!(e, crate::store::StoreError::NoSuchResolution { .. }) {
        return CliError::Store(e);
    }
    CliError::Interrupted {
        doing: doing.to_owned(),
        source: e,
    }
}

/// Replays the transport inbox dead letters `ids` through the application's inbox core
/// ([`App::outbox`]); refused, replaying nothing, when the application did not give its outbox
/// (the tool cannot know where the application routes a received event).
async fn replay_received(
    store: &crate::Store,
    app: &App<'_>,
    ids: &[i64],
    actor: &str,
    reason: &str,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let Some(build) = app.outbox_factory() else {
        return Err(CliError::Refused(format!(
            "{}; nothing was replayed",
            not_here(ids)
        )));
    };
    let outbox = build(store.clone())?;
    let r = outbox.replay_inbox_dead_letters(ids, actor, reason).await?;
    writeln!(
        io.out,
        "replayed {} inbox dead letter{} through the inbox core: {} ({} new events, {} already in the outbox)",
        ids.len(),
        if ids.len() == 1 { "" } else { "s" },
        join_ids(ids, 20),
        r.appended,
        r.duplicates
    )?;
    Ok(())
}

/// After a replay over `filter`: the transport inbox dead letters it left open (they have no
/// delivery), replayed through the application's inbox core in pages when the application gave
/// its outbox, else named once. Returns how many there were.
async fn replay_inbox_matching(
    store: &crate::Store,
    app: &App<'_>,
    filter: &DeadLetterFilter,
    actor: &str,
    reason: &str,
    io: &mut Io<'_>,
) -> Result<u64, CliError> {
    let mut replayed = 0;
    loop {
        // In pages, as the store's part: memory stays one page.
        let page = DeadLetterFilter {
            limit: Some(RESOLVE_PAGE),
            ..filter.clone()
        };
        let page = store.dead_letters(&page).await?;
        let left: Vec<i64> = page
            .iter()
            .filter(|d| d.origin.is_some())
            .map(|d| d.id)
            .collect();
        if left.is_empty() {
            return Ok(replayed);
        }
        if app.outbox_factory().is_none() {
            writeln!(io.err, "warning: skipped {}", not_here(&left))?;
            // What is open now is the inbox's (or came after the store's part).
            return Ok(store.count_dead_letters(filter).await?);
        }
        replay_received(store, app, &left, actor, reason, io).await?;
        replayed += left.len() as u64;
        if page.len() < RESOLVE_PAGE as usize {
            return Ok(replayed);
        }
    }
}

/// Why this tool does not replay the transport inbox dead letters `ids`.
fn not_here(ids: &[i64]) -> String {
    format!(
        "dead letter{} {} {} a transport's inbox could not accept: the application's inbox core replays {}, and this tool has none — use the application's own tool (cli::App::outbox) or Outbox::replay_inbox_dead_letters, or purge {}",
        if ids.len() == 1 { "" } else { "s" },
        join_ids(ids, 20),
        if ids.len() == 1 { "is a message" } else { "are messages" },
        if ids.len() == 1 { "it" } else { "them" },
        if ids.len() == 1 { "it" } else { "them" },
    )
}

fn report_matching(
    entry: &AuditEntry,
    total: u64,
    done: &str,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    writeln!(
        io.out,
        "{done} {} dead letter{}",
        entry.count,
        if entry.count == 1 { "" } else { "s" }
    )?;
    if entry.count < total {
        writeln!(
            io.out,
            "skipped {} that another operation resolved in the meantime",
            total - entry.count
        )?;
    }
    audit_line(entry, io)
}

fn selection(args: &ResolveArgs) -> String {
    let mut parts = Vec::new();
    if args.all {
        parts.push("all open".to_owned());
    }
    if let Some(h) = &args.handler {
        parts.push(format!("handler {h}"));
    }
    if let Some(e) = &args.event {
        parts.push(format!("event {e}"));
    }
    parts.join(", ")
}

/// Asks on the terminal; `false` without one.
pub(super) fn confirm(question: &str, io: &mut Io<'_>) -> Result<bool, CliError> {
    if !io.prompt {
        return Ok(false);
    }
    write!(io.err, "{question} [y/N] ")?;
    io.err.flush()?;
    let mut answer = String::new();
    // A blocking read is fine here: the tool waits for the operator and nothing else.
    io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

/// Who the audit log names: `given` (`--actor`), else the login name. Refuses an empty one,
/// so that the audit log never says "unknown"; `done` ends the message (`replayed`).
pub(super) fn actor(given: Option<&str>, done: &str) -> Result<String, CliError> {
    match given {
        Some(a) if a.trim().is_empty() => Err(CliError::Refused(format!(
            "--actor must name who does this: it is written to the audit log; nothing was {done}"
        ))),
        Some(a) => Ok(a.trim().to_owned()),
        None => login_name().ok_or_else(|| {
            CliError::Refused(format!(
                "cannot tell who you are ($USER, $LOGNAME and $USERNAME are unset and the process's user has no name): pass --actor WHO, written to the audit log; nothing was {done}"
            ))
        }),
    }
}

/// The login name, as `whoami` finds it: `$USER`, `$LOGNAME`, `$USERNAME`, else (on Unix) the
/// name of the process's user in `/etc/passwd`.
pub(super) fn login_name() -> Option<String> {
    ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|k| {
            std::env::var(k)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        })
        .or_else(passwd_name)
}

#[cfg(unix)]
fn passwd_name() -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    // /proc/self belongs to the effective user of the process, the one `whoami` names.
    let uid = std::fs::metadata("/proc/self").ok()?.uid().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        (fields.next()? == uid && !name.is_empty()).then(|| name.to_owned())
    })
}

#[cfg(not(unix))]
fn passwd_name() -> Option<String> {
    None
}
