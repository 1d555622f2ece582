//! A simulated player's client: walk forward, and once a second a 10% chance of turning left or
//! right and a 10% chance of jumping; turn around when its character hits something.

use std::f32::consts::{FRAC_PI_2, PI, TAU};

use rand::Rng;
use rand::rngs::SmallRng;

use super::world::Input;

pub struct Bot {
    rng: SmallRng,
    yaw: f32,
}

impl Bot {
    pub fn new(rng: SmallRng, yaw: f32) -> Bot {
        Bot { rng, yaw }
    }

    pub fn yaw(&self) -> f32 {
        self.yaw
    }

    /// The once-a-second decision. `Some` input when the bot changes anything.
    pub fn every_second(&mut self) -> Option<Input> {
        let mut changed = false;
        if self.rng.random_bool(0.1) {
            let turn = if self.rng.random_bool(0.5) { FRAC_PI_2 } else { -FRAC_PI_2 };
            self.yaw = (self.yaw + turn).rem_euclid(TAU);
            changed = true;
        }
        let jump = self.rng.random_bool(0.1);
        (changed || jump).then_some(Input { forward: true, yaw: self.yaw, jump })
    }

    /// Called with the bot's own character state as the server published it. A blocked
    /// character turns around (once per hit: facing away from the obstacle unblocks it).
    pub fn observe(&mut self, blocked: bool, server_yaw: f32) -> Option<Input> {
        if blocked && (server_yaw - self.yaw).abs() < 1e-3 {
            self.yaw = (self.yaw + PI).rem_euclid(TAU);
            return Some(Input { forward: true, yaw: self.yaw, jump: false });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::super::world::{Arena, Character, FPS};
    use super::*;

    #[test]
    fn decisions_happen_about_one_second_in_five() {
        let mut bot = Bot::new(SmallRng::seed_from_u64(1), 0.0);
        let changes = (0..10_000).filter(|_| bot.every_second().is_some()).count();
        // P(turn or jump) = 1 - 0.9 * 0.9 = 0.19.
        assert!((1_700..2_100).contains(&changes), "{changes}");
    }

    #[test]
    fn bots_turn_around_and_keep_walking_in_a_walled_arena() {
        let arena = Arena { half_size: 5.0, obstacles: vec![] };
        let mut bot = Bot::new(SmallRng::seed_from_u64(2), 0.0);
        let mut c = Character::new([0.0, 0.0], 0.0);
        let mut turns = 0;
        for frame in 0..FPS * 20 {
            if frame % FPS == 0
                && let Some(input) = bot.every_second()
            {
                c.apply(input);
            }
            c.step(&arena, 1.0 / FPS as f32);
            if let Some(input) = bot.observe(c.blocked, c.yaw) {
                turns += 1;
                c.apply(input);
            }
        }
        assert!(turns >= 5, "walking 120 m in a 10 m box hits walls often: {turns}");
        assert!(!arena.blocked(c.pos[0], c.pos[2]));
    }
}
