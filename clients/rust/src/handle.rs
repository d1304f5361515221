//! What every clone of a lock handle shares: its current hold (with how many guards share it)
//! and the releases it has on their way.
//!
//! A release in flight belongs to the handle. Every acquire carries `ONCE`, so an acquire that
//! reaches the server while the handle's old hold is still there is answered with the old
//! token; if the old hold's release then lands, the new guard would say held over nothing. So
//! the handle's next acquire waits until every release it started has been answered (a guard
//! dropped, a release future dropped half-way: both finish in the background and are waited
//! for), and an acquire during which a release started is sent again (`ONCE` makes that safe).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::hold::{Abandoned, Hold};

/// The shared state of one handle.
pub(crate) struct HandleState {
    /// One acquire at a time per handle (the server lets an owner wait once per key anyway).
    pub(crate) gate: tokio::sync::Mutex<()>,
    slot: Mutex<Option<ActiveHold>>,
    /// The releases started (ever) and still running.
    releases: watch::Sender<Releases>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Releases {
    started: u64,
    running: u64,
}

/// The handle's current hold and how many guards share it.
struct ActiveHold {
    hold: Arc<Hold>,
    guards: usize,
}

/// What ending one guard did to the handle's hold.
pub(crate) enum GuardEnd {
    /// Other guards of the hold remain.
    Remaining,
    /// That was the hold's last guard: the caller ends the hold.
    Last,
    /// The guard's hold was no longer the handle's (it was lost and replaced).
    Stale,
}

/// Where the handle's releases stood when an acquire was about to be sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark(u64);

impl HandleState {
    pub(crate) fn new() -> HandleState {
        HandleState {
            gate: tokio::sync::Mutex::new(()),
            slot: Mutex::new(None),
            releases: watch::Sender::new(Releases::default()),
        }
    }

    fn slot(&self) -> MutexGuard<'_, Option<ActiveHold>> {
        // The slot is only swapped or counted under this lock; a panic elsewhere cannot leave
        // it half-updated, so a poisoned lock is used as it is.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle's hold, while the application may still use it.
    pub(crate) fn current(&self) -> Option<Arc<Hold>> {
        self.slot()
            .as_ref()
            .filter(|a| a.hold.is_active())
            .map(|a| a.hold.clone())
    }

    /// One more guard of `hold`, if it is still the handle's hold.
    pub(crate) fn reenter(&self, hold: &Arc<Hold>) -> bool {
        match self.slot().as_mut() {
            Some(active) if Arc::ptr_eq(&active.hold, hold) => {
                active.guards += 1;
                true
            }
            _ => false,
        }
    }

    /// `hold` (with one guard) becomes the handle's hold; returns the one it replaces.
    pub(crate) fn replace(&self, hold: Option<Arc<Hold>>) -> Option<Arc<Hold>> {
        let new = hold.map(|hold| ActiveHold { hold, guards: 1 });
        std::mem::replace(&mut *self.slot(), new).map(|old| old.hold)
    }

    /// One guard of `hold` ends.
    pub(crate) fn end_guard(&self, hold: &Arc<Hold>) -> GuardEnd {
        let mut slot = self.slot();
        match slot.as_mut() {
            Some(active) if Arc::ptr_eq(&active.hold, hold) => {
                active.guards = active.guards.saturating_sub(1);
                if active.guards > 0 {
                    return GuardEnd::Remaining;
                }
                *slot = None;
                GuardEnd::Last
            }
            _ => GuardEnd::Stale,
        }
    }

    /// Waits until every release of the handle has been answered; returns the mark to compare
    /// with after the acquire ([`HandleState::released_since`]).
    pub(crate) async fn settle_releases(&self) -> Mark {
        let mut rx = self.releases.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let settled = rx.wait_for(|r| r.running == 0).await.map(|r| r.started);
        Mark(settled.unwrap_or(u64::MAX))
    }

    /// Whether a release started after `mark` (while an acquire was on its way).
    pub(crate) fn released_since(&self, mark: Mark) -> bool {
        self.releases.borrow().started != mark.0
    }

    /// Counts a release of this handle from now until the ticket is dropped.
    fn ticket(self: &Arc<Self>) -> Ticket {
        self.releases.send_modify(|r| {
            r.started += 1;
            r.running += 1;
        });
        Ticket(self.clone())
    }

    /// Sends a release in the background (a guard dropped), on `runtime`; the handle's next
    /// acquire waits for it. With no runtime (it has shut down), nothing is sent and nothing
    /// waits: the lease ends the hold.
    pub(crate) fn release_in_background(
        self: &Arc<Self>,
        runtime: Option<&Handle>,
        release: impl Future<Output = ()> + Send + 'static,
    ) {
        let ticket = self.ticket();
        if let Some(runtime) = runtime {
            // Once the runtime has shut down the task never runs; the ticket is dropped with it.
            runtime.spawn(async move {
                release.await;
                drop(ticket);
            });
        }
    }

    /// Runs `release` here, counted as the handle's release in flight; if the returned future
    /// is dropped before it ends, the release goes on in the background on `runtime`.
    pub(crate) fn release_here<T: Send + 'static>(
        self: &Arc<Self>,
        runtime: Option<Handle>,
        release: impl Future<Output = T> + Send + 'static,
    ) -> Tracked<T> {
        Tracked {
            release: Some(Box::pin(release)),
            ticket: Some(self.ticket()),
            runtime,
        }
    }
}

/// A hold of this handle that its side stopped believing in while the server may still have
/// it is released in the background, counted like any release of the handle: its next acquire
/// (`ONCE`) cannot get that hold back, token and all, before the release is answered.
pub(crate) struct HandleReleases(pub(crate) std::sync::Weak<HandleState>);

impl Abandoned for HandleReleases {
    fn release_abandoned(&self, hold: Arc<Hold>) {
        let runtime = hold.runtime.clone().or_else(|| Handle::try_current().ok());
        match self.0.upgrade() {
            Some(state) => state.release_in_background(runtime.as_ref(), hold.release_abandoned()),
            None => {
                if let Some(runtime) = runtime {
                    runtime.spawn(hold.release_abandoned());
                }
            }
        }
    }
}

/// Counts one release of the handle while it lives.
struct Ticket(Arc<HandleState>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0
            .releases
            .send_modify(|r| r.running = r.running.saturating_sub(1));
    }
}

/// A release run by the caller ([`HandleState::release_here`]).
pub(crate) struct Tracked<T: Send + 'static> {
    release: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    ticket: Option<Ticket>,
    runtime: Option<Handle>,
}

impl<T: Send + 'static> Future for Tracked<T> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let Some(release) = self.release.as_mut() else {
            return Poll::Ready(None);
        };
        let out = std::task::ready!(release.as_mut().poll(cx));
        self.release = None;
        self.ticket = None;
        Poll::Ready(Some(out))
    }
}

impl<T: Send + 'static> Drop for Tracked<T> {
    fn drop(&mut self) {
        let (Some(release), Some(ticket)) = (self.release.take(), self.ticket.take()) else {
            return;
        };
        if let Some(runtime) = &self.runtime {
            runtime.spawn(async move {
                let _ = release.await;
                drop(ticket);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;

    /// Whether `settle_releases` finishes within 50 ms.
    async fn settles(state: &HandleState) -> bool {
        tokio::time::timeout(Duration::from_millis(50), state.settle_releases())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_release_given_up_on_half_way_is_still_waited_for() {
        let state = Arc::new(HandleState::new());
        let mark = state.settle_releases().await;
        let (answer, answered) = oneshot::channel::<()>();
        let release = state.release_here(Some(Handle::current()), async move {
            let _ = answered.await;
        });
        // Polled once, then dropped (a timeout around `release()`): it goes on in the background.
        assert!(tokio::time::timeout(Duration::from_millis(1), release)
            .await
            .is_err());
        assert!(state.released_since(mark));
        assert!(
            !settles(&state).await,
            "the next acquire did not wait for it"
        );
        answer.send(()).unwrap();
        assert!(settles(&state).await);
    }

    #[tokio::test]
    async fn a_release_in_the_background_is_waited_for_and_one_run_here_too() {
        let state = Arc::new(HandleState::new());
        let (answer, answered) = oneshot::channel::<()>();
        state.release_in_background(Some(&Handle::current()), async move {
            let _ = answered.await;
        });
        assert!(!settles(&state).await);
        answer.send(()).unwrap();
        assert!(settles(&state).await);
        // Run here to its end: nothing left to wait for.
        assert_eq!(state.release_here(None, async { 7 }).await, Some(7));
        assert!(settles(&state).await);
        // With no runtime to run it on (shut down), nothing is sent and nothing waits.
        state.release_in_background(None, std::future::pending::<()>());
        assert!(settles(&state).await);
    }
}
