//! One step of a replication run: its clients held for `--step-hold`, the gateway, the servers
//! and the bots sampled every second, and the step summed up against the hold rule
//! (`rule.rs`). Apart from the run's orchestration in `mod.rs` (ramping, groups, the report).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use super::fleet::{BotSample, Fleet, LoadCpu};
use super::report::{self, GroupFigures, Step};
use super::scrape::{self, Scrape, TickWindow};
use super::{Group, ReplicationArgs, rule};
use crate::machine::ProcSample;
use crate::sim::bots::rates_between;
use crate::sim::server::ServerStats;

/// The world's count of due updates it did not queue (window or outbox full, or a rewind
/// pending): `held_back_per_client_per_s`.
const HELD_BACK: &str = "spatial_updates_coalesced";

/// The same, by the `reason` label: `held_back_by_reason`.
const HELD_BACK_BY: &str = "spatial_updates_held_back{reason=\"";

/// The world's count of server frames that went out in one pass with the frame before them:
/// `frames_merged_per_server_per_s`.
const FRAMES_MERGED: &str = "spatial_frames_merged";
/// Passes a delivery found waiting behind another (its I/O thread a tick or more late), and
/// passes it dropped: `deliveries_late_per_s`, `passes_dropped`.
const PASSES_WAITED: &str = "spatial_delivery_passes_waited";
const PASSES_DROPPED: &str = "spatial_delivery_passes_dropped";

/// The world's counter of cell updates encoded (one per cell, version sent from and codec, per
/// pass): `cell_encodings_per_pass`.
const ENCODINGS: &str = "spatial_cell_encodings";

/// The 5th percentile (the value with 5% of them below it), 0 for none. Sorts `values`.
pub(super) fn p5(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 20).copied().unwrap_or(0.0)
}

/// The mean of `values`, 0 for none (not the -0.0 an empty float sum starts from).
pub(super) fn mean(values: &[f64]) -> f64 {
    if values.is_empty() { 0.0 } else { values.iter().sum::<f64>() / values.len() as f64 }
}

/// Counters of the bots at one instant, for differences over a step.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct BotCounts {
    errors: u64,
    decode_errors: u64,
    gaps: u64,
    repeats: u64,
}

impl BotCounts {
    fn of(sample: &BotSample) -> BotCounts {
        BotCounts {
            errors: sample.errors,
            decode_errors: sample.decode_errors,
            gaps: sample.gaps,
            repeats: sample.repeats,
        }
    }
}

/// The clients outside the ramp, if any.
pub(super) struct Groups<'a> {
    pub slow: Option<&'a Group>,
    pub frozen: Option<&'a Group>,
    pub freeze: Duration,
}

/// A group's counters at the start of a hold.
struct GroupStart {
    counts: Vec<(usize, u64)>,
    errors: u64,
}

impl GroupStart {
    fn read(group: &Group) -> GroupStart {
        group.stats.latency_us.take();
        GroupStart {
            counts: group.stats.updates_per_bot(),
            errors: group.stats.errors.load(Ordering::Relaxed),
        }
    }

    /// The group's figures over the `seconds` since `self` was read.
    fn figures(&self, group: &Group, seconds: f64) -> GroupFigures {
        let stats = &group.stats;
        let mut rates = rates_between(&self.counts, &stats.updates_per_bot(), seconds);
        let rates_p5 = p5(&mut rates);
        GroupFigures {
            clients: group.clients,
            connected: stats.connected.load(Ordering::Relaxed) as usize,
            updates_per_s: report::Rate { mean: mean(&rates), p5: rates_p5 },
            age_ms: report::Tick::of_us(&stats.latency_us.merged()),
            errors: stats.errors.load(Ordering::Relaxed) - self.errors,
            decode_errors: stats.decode_errors.load(Ordering::Relaxed),
            version_gaps: stats.version_gaps.load(Ordering::Relaxed),
        }
    }
}

/// Holds one step for `--step-hold`, sampling every second, and sums it up. The bots' error
/// counts are taken since `counted` (where the previous step's ended, so this step's ramp
/// counts); the step's own end is returned with it.
#[allow(clippy::too_many_arguments)]
pub(super) async fn hold(
    args: &ReplicationArgs,
    clients: usize,
    metrics_addr: SocketAddr,
    gateway_pid: u32,
    fleet: &mut Fleet,
    servers: &[Arc<ServerStats>],
    groups: &Groups<'_>,
    counted: BotCounts,
) -> anyhow::Result<(Step, BotCounts)> {
    let frames = || -> Vec<u64> { servers.iter().map(|s| s.frames.load(Ordering::Relaxed)).collect() };
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    let unpublished = || -> u64 { servers.iter().map(|s| load(&s.refused) + load(&s.unanswered)).sum() };
    let release_retries = || -> u64 { servers.iter().map(|s| load(&s.release_retries)).sum() };
    // Each server's frame rate between two readings, and the slowest.
    let each = |now: &[u64], before: &[u64], dt: f64| -> Vec<f64> {
        now.iter().zip(before).map(|(n, b)| (n - b) as f64 / dt).collect()
    };
    let slowest = |now: &[u64], before: &[u64], dt: f64| -> f64 {
        each(now, before, dt).into_iter().fold(f64::INFINITY, f64::min)
    };
    let (fanouts, subscribers) = args.scenario.fanout_series();
    // Played in the spatial world (`spatial`, `lod`): its figures are reported.
    let spatial = args.scenario.world().is_some();
    let scrape = || tokio::task::spawn_blocking(move || Scrape::fetch(metrics_addr));
    let slow0 = groups.slow.map(GroupStart::read);
    let frozen0 = groups.frozen.map(GroupStart::read);
    if let Some(frozen) = groups.frozen {
        frozen.link.freeze(groups.freeze);
    }
    let first = scrape().await??;
    let first_totals = first.clone();
    // Update ages recorded before the hold are dropped with this first sample.
    let sample0 = fleet.sample().await?;
    let counting_from = Instant::now();
    let counts0 = counted;
    let cpu0 = ProcSample::read(gateway_pid).context("the gateway process is gone")?;
    let load0 = LoadCpu::read(fleet);
    let frames0 = frames();
    let (unpublished0, release_retries0) = (unpublished(), release_retries());
    let hold_counts0 = sample0.updates_per_bot.clone();
    let hold_entities0 = sample0.entities_per_replica_bot.clone();
    let mut last_counts = sample0.updates_per_bot;
    let mut latency = crate::sim::ages::histogram();
    let mut load_lag = crate::sim::ages::histogram();
    let mut rates = Vec::new();
    let mut fewest_connected = sample0.connected;
    // The longest a cell waited for an update that merged its changes, over the hold (the
    // first sample took what the ramp recorded).
    let mut longest_cell_wait_us = 0;
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    // A late second is followed by a full one, not by a burst of short ones.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    // When the bots' counters were last read: each second's rates are over the time between
    // two readings, not between two ticks (a reading waits on the bot workers' pipes).
    let mut last_at = counting_from;
    let (mut prev, mut prev_cpu, mut prev_frames) = (first, cpu0, frames0.clone());
    let mut samples = Vec::new();
    let bar = ProgressBar::new(args.step_hold.as_secs()).with_message(format!("holding {clients} clients"));
    bar.set_style(ProgressStyle::with_template("{msg} [{bar:20}] {pos}/{len}s").expect("template"));
    while started.elapsed() < args.step_hold {
        ticker.tick().await;
        let sample = fleet.sample().await?;
        let dt = last_at.elapsed().as_secs_f64();
        last_at = Instant::now();
        fewest_connected = fewest_connected.min(sample.connected);
        longest_cell_wait_us = longest_cell_wait_us.max(sample.longest_cell_wait_us);
        let mut second = rates_between(&last_counts, &sample.updates_per_bot, dt);
        let second_p5 = p5(&mut second);
        let mut ages = crate::sim::ages::histogram();
        sample.record_ages(&mut ages)?;
        latency.add(&ages)?;
        sample.record_load_lag(&mut load_lag)?;
        let second_latency = report::Latency::of_us(&ages);
        last_counts = sample.updates_per_bot;
        let s = scrape().await??;
        let cpu = ProcSample::read(gateway_pid).context("the gateway process is gone")?;
        let frames = frames();
        let rate = |name: &str| (s.get(name) - prev.get(name)) / dt;
        let sample = report::Sample {
            t_s: started.elapsed().as_secs_f64(),
            connections: s.get("connection_num") as u64,
            channels: s.get("channel_num") as u64,
            figures: report::Figures {
                channel_tick_hz: rate("channel_ticks") / s.get("channel_num").max(1.0),
                sent_hz: rate(fanouts) / s.get(subscribers).max(1.0),
                fanout_hz: report::Rate { mean: mean(&second), p5: second_p5 },
                latency_ms: second_latency,
                tick_ms: TickWindow::between(&prev, &s).tick(),
                gateway_cpu_pct: cpu.cpu_pct_since(&prev_cpu),
                gateway_rss_bytes: cpu.rss_bytes,
                msgs_in_per_s: rate("messages_in"),
                msgs_out_per_s: rate("messages_out"),
                bytes_in_per_s: rate("bytes_in"),
                bytes_out_per_s: rate("bytes_out"),
                server_fps: slowest(&frames, &prev_frames, dt),
            },
        };
        bar.set_position(started.elapsed().as_secs());
        bar.set_message(format!(
            "holding {clients} clients: {:.1} updates/s per client (p5 {:.1}), age p99 {:.0} ms, gateway {:.0}% of a core",
            sample.figures.fanout_hz.mean,
            sample.figures.fanout_hz.p5,
            sample.figures.latency_ms.p99,
            sample.figures.gateway_cpu_pct
        ));
        rates.extend(second);
        samples.push(sample);
        (prev, prev_cpu, prev_frames) = (s, cpu, frames);
    }
    bar.finish_and_clear();
    let last = scrape().await??;
    let cpu1 = ProcSample::read(gateway_pid).context("the gateway process is gone")?;
    let load1 = LoadCpu::read(fleet);
    let sample1 = fleet.sample().await?;
    let counted_for = counting_from.elapsed().as_secs_f64();
    sample1.record_ages(&mut latency)?;
    sample1.record_load_lag(&mut load_lag)?;
    let counts1 = BotCounts::of(&sample1);
    longest_cell_wait_us = longest_cell_wait_us.max(sample1.longest_cell_wait_us);
    let longest_cell_wait_ms = longest_cell_wait_us as f64 / 1e3;
    let seconds = started.elapsed().as_secs_f64();
    let frames1 = frames();
    let server_fps = slowest(&frames1, &frames0, seconds);
    let server_fps_each = each(&frames1, &frames0, seconds);
    let fanout_mean = mean(&rates);
    let p5_of_seconds = p5(&mut rates);
    // `rates` is sorted now. A client that gets nothing for half a second keeps its rate over
    // the hold, but not its count in that second: this catches stalls the rule's figure hides.
    let p1_of_seconds = rates.get(rates.len() / 100).copied().unwrap_or(0.0);
    // The rule's figure: each client's rate over the whole hold. A count in one second moves
    // by one either way when a delivery lands a few milliseconds either side of the second's
    // boundary, and that alone is 3% of 30 Hz; over the hold it is a third of a percent.
    let mut hold_rates = rates_between(&hold_counts0, &sample1.updates_per_bot, counted_for);
    let fanout_p5 = p5(&mut hold_rates);
    let entity_rates = rates_between(&hold_entities0, &sample1.entities_per_replica_bot, counted_for);
    // Sorted by `p5`: the client that got the fewest. The p5 and p1 rules let a few clients
    // get nothing at all; this one does not.
    let fewest_rate = hold_rates.first().copied().unwrap_or(0.0);
    let per_s = |name: &str| (last.get(name) - first_totals.get(name)) / seconds;
    let tick_window = TickWindow::between(&first_totals, &last);
    let tick_ms = tick_window.tick();
    // A CPU-time histogram of the spatial world over the hold, with its exact mean in ms (from
    // the series' sum and count; `None`: nothing recorded, or not the spatial scenario).
    let cpu_window = |bucket: &str, sum: &str| {
        spatial
            .then(|| TickWindow::of(bucket, &first_totals, &last))
            .filter(|window| window.passes() > 0.0)
            .map(|window| {
                let mean_ms = (last.get(sum) - first_totals.get(sum)) / window.passes() * 1e3;
                (window, mean_ms)
            })
    };
    // The world's CPU time per pass, and the cell updates a pass encoded on average.
    let pass_cpu =
        cpu_window(scrape::PASS_CPU_BUCKET, "spatial_pass_cpu_seconds_sum").map(|(window, mean_ms)| {
            let encodings = last
                .has(ENCODINGS)
                .then(|| (last.get(ENCODINGS) - first_totals.get(ENCODINGS)) / window.passes());
            (window, mean_ms, encodings)
        });
    // The I/O threads' CPU time per delivery run (each run delivers the passes waiting on its
    // thread: one, unless the thread was a tick late; `None` for a gateway with no deliveries).
    let delivery_cpu = cpu_window(scrape::DELIVERY_CPU_BUCKET, "spatial_delivery_cpu_seconds_sum")
        .map(|(window, mean_ms)| (window.tick(), mean_ms));
    let passes_dropped = (last.get(PASSES_DROPPED) - first_totals.get(PASSES_DROPPED)).max(0.0) as u64;
    let channel_tick_hz = per_s("channel_ticks") / last.get("channel_num").max(1.0);
    // Every server frame changes every character, so a client can get at most one update per
    // frame: the rate to hold is the server's frame rate (the 50 Hz fan-out never throttles it;
    // `lod`'s clients ask for 20 Hz, which does, and hold that).
    // That rate counts the frames the gateway took, so a frame it refused (or left unanswered)
    // fails the step on its own: it must not lower the p5 target.
    let frames_not_published = unpublished() - unpublished0;
    // Updates merged into a later one because a viewer's window or outbox was full: not a
    // loss (the later update carries the newest state) but one message fewer, which the rate
    // rules below count; reported, not a rule of its own.
    let coalesced = if spatial { HELD_BACK } else { "channel_updates_coalesced" };
    let hold = rule::step_hold(
        &rule::Measured {
            clients,
            fewest_connected,
            bot_errors: counts1.errors - counts0.errors,
            decode_errors: counts1.decode_errors - counts0.decode_errors,
            version_gaps: counts1.gaps - counts0.gaps,
            version_repeats: counts1.repeats - counts0.repeats,
            frames_not_published,
            channel_tick_hz,
            fanout_p5,
            fewest_rate,
            p1_of_seconds,
            passes_timed: tick_window.passes(),
            pass_p99_ms: tick_ms.p99,
            server_fps,
            passes_dropped: spatial.then_some(passes_dropped),
            longest_cell_wait_ms,
        },
        args.scenario,
    );
    let step = Step {
        clients,
        connected: fewest_connected as usize,
        held: hold.held(),
        hold,
        figures: report::Figures {
            channel_tick_hz,
            sent_hz: per_s(fanouts) / last.get(subscribers).max(1.0),
            fanout_hz: report::Rate { mean: fanout_mean, p5: fanout_p5 },
            latency_ms: report::Latency::of_us(&latency),
            tick_ms,
            gateway_cpu_pct: cpu1.cpu_pct_since(&cpu0),
            gateway_rss_bytes: cpu1.rss_bytes,
            msgs_in_per_s: per_s("messages_in"),
            msgs_out_per_s: per_s("messages_out"),
            bytes_in_per_s: per_s("bytes_in"),
            bytes_out_per_s: per_s("bytes_out"),
            server_fps,
        },
        bench_cpu_pct: load1.pct_since(&load0),
        bot_processes: args.bot_processes.max(1),
        load_nice: sample1.load_nice.unwrap_or(0),
        load_lag_ms: report::Tick::of_us(&load_lag),
        bot_errors: counts1.errors - counts0.errors,
        decode_errors: counts1.decode_errors - counts0.decode_errors,
        version_gaps: counts1.gaps - counts0.gaps,
        version_repeats: counts1.repeats - counts0.repeats,
        slow: groups.slow.zip(slow0.as_ref()).map(|(g, start)| start.figures(g, seconds)),
        frozen: groups.frozen.zip(frozen0.as_ref()).map(|(g, start)| start.figures(g, seconds)),
        entity_updates_per_client_per_s: (!entity_rates.is_empty()).then(|| mean(&entity_rates)),
        replica_bots: entity_rates.len(),
        handovers_per_s: spatial.then(|| per_s("spatial_handovers")),
        longest_cell_wait_ms: spatial.then_some(longest_cell_wait_ms),
        held_back_per_client_per_s: last.has(coalesced).then(|| per_s(coalesced) / clients.max(1) as f64),
        held_back_by_reason: last
            .series(HELD_BACK_BY)
            .filter_map(|(series, _)| {
                let reason = series.strip_prefix(HELD_BACK_BY)?.strip_suffix("\"}")?;
                let n = per_s(series) / clients.max(1) as f64;
                (n > 0.0).then(|| (reason.to_owned(), n))
            })
            .collect(),
        max_tick_ms: spatial.then_some(tick_ms.max),
        pass_cpu_ms: pass_cpu.as_ref().map(|(window, ..)| window.tick()),
        pass_cpu_mean_ms: pass_cpu.as_ref().map(|(_, mean, _)| *mean),
        cell_encodings_per_pass: pass_cpu.as_ref().and_then(|(.., encodings)| *encodings),
        delivery_cpu_ms: delivery_cpu.map(|(tick, _)| tick),
        deliveries_late_per_s: (spatial && last.has(PASSES_WAITED)).then(|| per_s(PASSES_WAITED)),
        passes_dropped: (spatial && last.has(PASSES_DROPPED)).then_some(passes_dropped),
        delivery_cpu_mean_ms: delivery_cpu.map(|(_, mean)| mean),
        frames_not_published,
        server_fps_each,
        frames_merged_per_server_per_s: (spatial && last.has(FRAMES_MERGED))
            .then(|| per_s(FRAMES_MERGED) / f64::from(args.scenario.world().map_or(1, |w| w.slots()))),
        fanout_hz_p5_of_seconds: p5_of_seconds,
        release_retries: release_retries() - release_retries0,
        gateway_connections: last.get("connection_num") as u64,
        gateway_channels: last.get("channel_num") as u64,
        samples,
    };
    Ok((step, counts1))
}

#[cfg(test)]
mod tests {
    use super::{mean, p5, rates_between};

    #[test]
    fn a_clients_rate_is_its_count_over_the_whole_window() {
        // Three bots over 10 s; bot 7 joined after the first reading, and the second reading
        // lists the bots in another order (two processes joined the other way round).
        let rates = rates_between(&[(3, 100), (5, 50)], &[(7, 290), (5, 340), (3, 400)], 10.0);
        assert_eq!(rates, vec![29.0, 29.0, 30.0]);
        // Twenty bots: 5% of them (one) may be below the p5; the second lowest is the p5.
        let mut twenty: Vec<f64> = (0..20).map(|i| 30.0 - f64::from(i)).collect();
        assert_eq!(p5(&mut twenty), 12.0);
        assert_eq!(p5(&mut []), 0.0);
    }

    #[test]
    fn the_mean_of_nothing_is_a_plain_zero() {
        // An empty `f64` sum is -0.0, which the JSON printed as "-0.0".
        assert!(mean(&[]).is_sign_positive());
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
    }
}
