//! Shipping an update to the engines through the bridge's engine halves: one engine after the
//! other (a failure stops the rest, which keep their previous weights), or — for a bridge
//! that moves data over the transport — every engine at once while the trainer half sends,
//! since a broadcast needs every receiver in it.

use super::common::{Ledger, cause, mixed_note};
use crate::error::RlError;
use tandem_plugin_api::{Shipment, UpdateReport};
use tandem_runtime::launch::{RemoteEngine, RemoteTrainer};

/// Applies `shipped` on every engine in rank order; the first failure names the engine, says
/// it kept its previous weights and which engines already switched.
pub(super) fn in_order(
    ledger: &Ledger,
    shipped: &Shipment,
    engines: &[RemoteEngine],
) -> Result<Vec<UpdateReport>, RlError> {
    let for_engines = ledger.for_engines(shipped);
    let mut reports = Vec::with_capacity(engines.len());
    for (i, e) in engines.iter().enumerate() {
        let r = e.bridge_apply(for_engines.clone()).map_err(|err| {
            let switched: Vec<usize> = (0..i).collect();
            let (why, help) = cause(&err, e.name());
            let failed = RlError::failed(format!(
                "{} bridge: {} kept serving its previous weights: {why}{}",
                ledger.name,
                e.name(),
                mixed_note(&switched, shipped.version)
            ));
            match help {
                Some(h) => failed.with_help(h),
                None => failed,
            }
        })?;
        reports.push(r);
    }
    Ok(reports)
}

/// The trainer half sends while every engine applies, all at once. The first engine failure
/// is the sync's error (a sender's error is usually its consequence: a receiver gone); the
/// sender's own error when every engine succeeded is reported as such.
pub(super) fn together(
    ledger: &Ledger,
    shipped: &Shipment,
    trainer: &RemoteTrainer,
    engines: &[RemoteEngine],
) -> Result<Vec<UpdateReport>, RlError> {
    let for_engines = ledger.for_engines(shipped);
    let (sent, applied) = std::thread::scope(|s| {
        let sender = s.spawn(|| trainer.bridge_send(shipped.clone()));
        let receivers: Vec<_> = engines
            .iter()
            .map(|e| {
                let u = for_engines.clone();
                s.spawn(move || e.bridge_apply(u))
            })
            .collect();
        let applied: Vec<_> = receivers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panicked()))
            .collect();
        let sent = sender.join().unwrap_or_else(|_| panicked());
        (sent, applied)
    });
    let switched: Vec<usize> = applied
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.is_ok().then_some(i))
        .collect();
    // The error to report: an engine whose worker itself failed (died, stopped answering)
    // comes first — the others' errors (a peer gone mid-broadcast) are its consequences.
    let culprit = applied
        .iter()
        .position(|r| matches!(r, Err(tandem_runtime::RuntimeError::Control(_))))
        .or_else(|| applied.iter().position(Result::is_err));
    if let Some(i) = culprit {
        let name = engines[i].name();
        let (why, help) = match &applied[i] {
            Err(err) => cause(err, name),
            Ok(_) => (String::new(), None),
        };
        let sender = match &sent {
            Err(s) => format!(" (the trainer's send: {})", cause(s, trainer.name()).0),
            Ok(()) => String::new(),
        };
        return Err(RlError::failed(format!(
            "{} bridge: {name} did not take v{}: {why}{sender}{}",
            ledger.name,
            shipped.version,
            mixed_note(&switched, shipped.version)
        ))
        .with_help(help.unwrap_or_else(|| {
            "an engine that refused before its first copy keeps its previous weights; one that \
             failed after it refuses to serve until the next complete sync"
                .to_owned()
        })));
    }
    let reports: Vec<UpdateReport> = applied.into_iter().filter_map(Result::ok).collect();
    sent.map_err(|e| {
        RlError::failed(format!(
            "{} bridge: the trainer's send of v{} failed after every engine applied it: {e}",
            ledger.name, shipped.version
        ))
    })?;
    Ok(reports)
}

fn panicked<T>() -> Result<T, tandem_runtime::RuntimeError> {
    Err(tandem_runtime::RuntimeError::runtime(
        "a sync thread panicked",
    ))
}
