//! The window of channel updates one session has in flight, shared by the session's task
//! (which sends them, sees the client's acknowledgements and handles resumes) and the channel
//! actors (which offer updates only while it has room). The rules are in
//! [`tickwire_fanout::Window`]; this is the lock around it, and the one flag that lets a channel
//! pass check for rewinds without taking the lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use tickwire_fanout::{Version, Window, WindowLimits};

/// A session's [`Window`], keyed by channel id.
#[derive(Debug)]
pub(crate) struct UpdateFlow {
    /// Mirrors `window.has_rewinds()`.
    rewound: AtomicBool,
    window: Mutex<Window<u64>>,
}

impl UpdateFlow {
    pub(crate) fn new(limits: WindowLimits) -> UpdateFlow {
        UpdateFlow { rewound: AtomicBool::new(false), window: Mutex::new(Window::new(limits)) }
    }

    /// A session's window as `config` sets it: `[channels.update_window]`, with the clients'
    /// acknowledgement delay.
    pub(crate) fn for_config(config: &crate::GatewayConfig) -> UpdateFlow {
        UpdateFlow::new(WindowLimits {
            ack_delay: config.session.ack_delay,
            ..config.channels.update_window.limits()
        })
    }

    /// The window. Nothing that holds it waits on anything else; a panic while holding it
    /// (there are none on these paths) would leave a consistent window, so poison is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Window<u64>> {
        self.window.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether one more update may be queued at `now`.
    pub(crate) fn has_room(&self, now: std::time::Instant) -> bool {
        self.lock().has_room(now)
    }

    /// [`UpdateFlow::has_room`], saying which bound of the window holds the update back.
    pub(crate) fn room(&self, now: std::time::Instant) -> Result<(), tickwire_fanout::Hold> {
        self.lock().room(now)
    }

    /// Whether the client looks stopped: see [`Window::stalled`].
    pub(crate) fn stalled(&self, now: std::time::Instant) -> bool {
        self.lock().stalled(now)
    }

    /// After a resume dropped updates of `channel` the client never got: the version its
    /// replica holds (`Some(None)`: it needs a snapshot).
    pub(crate) fn take_rewind(&self, channel: u64) -> Option<Option<Version>> {
        if !self.rewound.load(Ordering::Acquire) {
            return None;
        }
        let mut window = self.lock();
        let rewind = window.take_rewind(channel);
        self.rewound.store(window.has_rewinds(), Ordering::Release);
        rewind
    }

    /// The connection was replaced; the client holds every message up to `delivered`. The
    /// caller holds the lock, and has dropped the updates still in the outbox under it.
    pub(crate) fn resumed(&self, window: &mut Window<u64>, delivered: u64) {
        window.resume(delivered);
        self.rewound.store(window.has_rewinds(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use tickwire_fanout::WindowLimits;
    use tickwire_session::SessionConfig;

    /// The window's default acknowledgement delay is a literal in `tickwire-fanout`, which does
    /// not depend on the session crate; the gateway always sets it from the session's
    /// (`UpdateFlow::for_config`), but a window made with the defaults must agree too.
    #[test]
    fn the_window_and_the_session_default_to_the_same_ack_delay() {
        assert_eq!(WindowLimits::default().ack_delay, SessionConfig::default().ack_delay);
    }
}
