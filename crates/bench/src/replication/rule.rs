//! The rule a replication step is held to, from what the step measured. Apart from the
//! sampling in `mod.rs` so that it is a pure function of figures, and each condition can be
//! tested without a gateway.

use crate::hold::Hold;
use crate::sim::game::Scenario;

/// The channel's schedule: 50 Hz ticks (the `hifi` preset the world channel uses).
pub(super) const TICK_HZ: f64 = 50.0;
/// The simulated game servers' frame rate: their nominal rate, which the rule holds clients
/// to whatever rate the servers reached.
pub(super) const SERVER_FPS: f64 = 30.0;
/// The longest a fan-out pass may take: one tick.
pub(super) const PASS_BUDGET_MS: f64 = 1e3 / TICK_HZ;

/// What a step measured, as the rule reads it.
#[derive(Debug, Clone)]
pub(super) struct Measured {
    pub clients: usize,
    /// The fewest clients connected in any second of the hold.
    pub fewest_connected: u64,
    pub bot_errors: u64,
    pub decode_errors: u64,
    pub version_gaps: u64,
    pub version_repeats: u64,
    /// Server frames the gateway refused or left unanswered.
    pub frames_not_published: u64,
    /// Ticks per second of each channel.
    pub channel_tick_hz: f64,
    /// Updates per client over the whole hold: the p5 over clients, and the fewest.
    pub fanout_p5: f64,
    pub fewest_rate: f64,
    /// Updates per client-second, p1 over every client's every second.
    pub p1_of_seconds: f64,
    /// Fan-out passes the gateway timed over the hold, and their p99 in ms.
    pub passes_timed: f64,
    pub pass_p99_ms: f64,
    /// The slowest server's frame rate.
    pub server_fps: f64,
    /// Passes a delivery dropped (`spatial` and `lod` only).
    pub passes_dropped: Option<u64>,
    /// The longest a cell with characters in view waited for an update that merged it.
    pub longest_cell_wait_ms: f64,
}

/// The rule: every condition, each with what was measured and what it required.
pub(super) fn step_hold(m: &Measured, scenario: Scenario) -> Hold {
    // What each client must get: every frame at the servers' nominal rate, or as many as it
    // asked for if fewer (`lod`). Nominal, not measured: servers starved by the load generator
    // (they share its process) must not lower the bar the gateway is held to.
    let client_hz = scenario.client_hz().map_or(SERVER_FPS, |hz| hz.min(SERVER_FPS));
    // Every server frame changes every character, so a client can get at most one update per
    // frame: the rate to hold is the server's frame rate (the 50 Hz fan-out never throttles it;
    // `lod`'s clients ask for 20 Hz, which does, and hold that). A frame the gateway refused
    // (or left unanswered) fails the step on its own.
    let hold = Hold::new()
        .at_least("clients connected (fewest in any second)", m.fewest_connected as f64, m.clients as f64, "")
        .none("bot errors", m.bot_errors)
        .none("decode failures", m.decode_errors)
        .none("version gaps", m.version_gaps)
        .none("version repeats", m.version_repeats)
        .none("server frames not published", m.frames_not_published)
        .at_least("channel tick rate", m.channel_tick_hz, 0.95 * TICK_HZ, "Hz")
        // The rule's figure is each client's rate over the whole hold: a count in one second
        // moves by one either way when a delivery lands a few milliseconds either side of the
        // second's boundary, 3% of 30 Hz; over the hold a third of a percent. The p5 lets a
        // few clients get little; the fewest and the p1 of client-seconds catch those, and
        // stalls the hold's rate hides.
        .at_least("updates per client over the hold, p5", m.fanout_p5, 0.95 * client_hz, "/s")
        .at_least("updates per client over the hold, fewest", m.fewest_rate, 0.5 * client_hz, "/s")
        .at_least("updates per client-second, p1", m.p1_of_seconds, 0.5 * client_hz, "/s")
        // A pass-time histogram that recorded nothing (a renamed series, a metrics fault)
        // would read as 0 ms and pass the next rule.
        .at_least("fan-out passes timed", m.passes_timed, 1.0, "")
        .at_most("pass time p99", m.pass_p99_ms, PASS_BUDGET_MS, "ms")
        .at_least("server frame rate (slowest server)", m.server_fps, 0.95 * SERVER_FPS, "fps");
    // With `channels.spatial_delivery = "io_threads"` the world's pass time leaves out its
    // delivery on the I/O threads; a delivery that fell so far behind that it dropped passes
    // did not keep up either. (By default the world delivers, within its pass, and drops none.)
    let hold = match m.passes_dropped {
        Some(dropped) => hold.none("passes dropped by a delivery", dropped),
        None => hold,
    };
    // Level of detail holds cells back; none may starve.
    match scenario.longest_cell_wait_ms() {
        Some(most) => {
            hold.at_most("longest wait of a cell for a merged update", m.longest_cell_wait_ms, most, "ms")
        }
        None => hold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of 1,000 clients that met every condition.
    fn good() -> Measured {
        Measured {
            clients: 1_000,
            fewest_connected: 1_000,
            bot_errors: 0,
            decode_errors: 0,
            version_gaps: 0,
            version_repeats: 0,
            frames_not_published: 0,
            channel_tick_hz: 50.0,
            fanout_p5: 29.9,
            fewest_rate: 29.5,
            p1_of_seconds: 29.0,
            passes_timed: 500.0,
            pass_p99_ms: 5.0,
            server_fps: 30.0,
            passes_dropped: Some(0),
            longest_cell_wait_ms: 0.0,
        }
    }

    fn failed(m: &Measured, scenario: Scenario) -> Vec<&'static str> {
        step_hold(m, scenario).conditions.iter().filter(|c| !c.held).map(|c| c.name).collect()
    }

    #[test]
    fn a_good_step_holds() {
        for scenario in [Scenario::Single, Scenario::Spatial] {
            assert!(step_hold(&good(), scenario).held(), "{scenario:?}");
        }
    }

    /// Servers starved to 20 fps send 20 frames a second, and clients that get all of them
    /// still fail: the bar is the nominal 30 fps, not what the servers reached.
    #[test]
    fn clients_are_held_to_the_servers_nominal_rate() {
        let starved =
            Measured { fanout_p5: 20.0, fewest_rate: 20.0, p1_of_seconds: 20.0, server_fps: 20.0, ..good() };
        assert_eq!(
            failed(&starved, Scenario::Single),
            ["updates per client over the hold, p5", "server frame rate (slowest server)"]
        );
    }

    /// No pass timed reads as a p99 of 0 ms, which alone would pass.
    #[test]
    fn a_step_with_no_timed_pass_fails() {
        let untimed = Measured { passes_timed: 0.0, pass_p99_ms: 0.0, ..good() };
        assert_eq!(failed(&untimed, Scenario::Spatial), ["fan-out passes timed"]);
    }

    #[test]
    fn each_count_that_must_be_zero_fails_the_step() {
        let m = Measured {
            bot_errors: 1,
            version_gaps: 1,
            frames_not_published: 1,
            passes_dropped: Some(1),
            fewest_connected: 999,
            ..good()
        };
        assert_eq!(
            failed(&m, Scenario::Spatial),
            [
                "clients connected (fewest in any second)",
                "bot errors",
                "version gaps",
                "server frames not published",
                "passes dropped by a delivery"
            ]
        );
    }

    /// `lod` clients ask for 20 Hz: they are held to that, and no cell in view may starve.
    #[test]
    fn lod_clients_are_held_to_their_own_rate_and_cell_waits() {
        let lod = Measured { fanout_p5: 19.5, fewest_rate: 19.0, p1_of_seconds: 18.0, ..good() };
        assert!(step_hold(&lod, Scenario::Lod).held());
        let starved_cell = Measured { longest_cell_wait_ms: 60_000.0, ..lod };
        assert_eq!(failed(&starved_cell, Scenario::Lod), ["longest wait of a cell for a merged update"]);
    }
}
