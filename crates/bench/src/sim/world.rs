//! The arena and the character movement the game server runs every frame: walk at 6 m/s along
//! the facing, jump at 4.2 m/s against 9.8 m/s² of gravity, and stop at walls and obstacles.

use rand::Rng;

/// Server frames per second.
pub const FPS: u32 = 30;
/// Metres per second.
pub const WALK_SPEED: f32 = 6.0;
/// Metres per second squared.
pub const GRAVITY: f32 = 9.8;
/// Metres per second, upwards.
pub const JUMP_SPEED: f32 = 4.2;
/// A character's footprint radius, in metres.
pub const RADIUS: f32 = 0.4;

/// An obstacle's footprint: obstacles are taller than any jump, so collision is 2-D.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aabb {
    pub min: [f32; 2],
    pub max: [f32; 2],
}

impl Aabb {
    fn contains(&self, x: f32, z: f32, margin: f32) -> bool {
        x > self.min[0] - margin
            && x < self.max[0] + margin
            && z > self.min[1] - margin
            && z < self.max[1] + margin
    }
}

/// A square arena centred on the origin, walled on every side, with obstacles.
#[derive(Debug, Clone)]
pub struct Arena {
    pub half_size: f32,
    pub obstacles: Vec<Aabb>,
}

impl Arena {
    /// An arena of `2 * half_size` metres square with `count` obstacles of 2–8 m, placed from
    /// `rng`. B3 `single`: 200 × 200 m and 60 obstacles.
    pub fn generate(rng: &mut impl Rng, half_size: f32, count: usize) -> Arena {
        let obstacles = (0..count)
            .map(|_| {
                let (w, d) = (rng.random_range(2.0..8.0), rng.random_range(2.0..8.0));
                let x = rng.random_range(-half_size + 5.0..half_size - 5.0 - w);
                let z = rng.random_range(-half_size + 5.0..half_size - 5.0 - d);
                Aabb { min: [x, z], max: [x + w, z + d] }
            })
            .collect();
        Arena { half_size, obstacles }
    }

    /// True when a character centred at (x, z) would overlap a wall or an obstacle.
    pub fn blocked(&self, x: f32, z: f32) -> bool {
        let limit = self.half_size - RADIUS;
        x.abs() > limit || z.abs() > limit || self.obstacles.iter().any(|o| o.contains(x, z, RADIUS))
    }

    /// A free spot, drawn from `rng`.
    pub fn spawn(&self, rng: &mut impl Rng) -> [f32; 2] {
        loop {
            let limit = self.half_size - 1.0;
            let (x, z) = (rng.random_range(-limit..limit), rng.random_range(-limit..limit));
            if !self.blocked(x, z) {
                return [x, z];
            }
        }
    }
}

/// What a player's client asks for: walk or stand, which way to face, and whether to jump.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Input {
    pub forward: bool,
    /// Facing, in radians (0 = +z, increasing towards +x).
    pub yaw: f32,
    pub jump: bool,
}

/// One character, as the authoritative server holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Character {
    /// x, y (height above the ground), z.
    pub pos: [f32; 3],
    pub yaw: f32,
    pub vertical_speed: f32,
    pub input: Input,
    /// The last frame's horizontal move hit a wall or an obstacle.
    pub blocked: bool,
}

impl Character {
    pub fn new(at: [f32; 2], yaw: f32) -> Character {
        Character {
            pos: [at[0], 0.0, at[1]],
            yaw,
            vertical_speed: 0.0,
            input: Input { forward: true, yaw, jump: false },
            blocked: false,
        }
    }

    pub fn grounded(&self) -> bool {
        self.pos[1] <= 0.0 && self.vertical_speed <= 0.0
    }

    /// Applies the latest input: facing at once, a jump only from the ground (consumed).
    pub fn apply(&mut self, input: Input) {
        self.input = input;
    }

    /// One fixed frame of `dt` seconds.
    pub fn step(&mut self, arena: &Arena, dt: f32) {
        self.yaw = self.input.yaw;
        if self.input.jump {
            if self.grounded() {
                self.vertical_speed = JUMP_SPEED;
            }
            self.input.jump = false;
        }
        self.blocked = false;
        if self.input.forward {
            let (x, z) = (
                self.pos[0] + self.yaw.sin() * WALK_SPEED * dt,
                self.pos[2] + self.yaw.cos() * WALK_SPEED * dt,
            );
            if arena.blocked(x, z) {
                self.blocked = true;
            } else {
                self.pos[0] = x;
                self.pos[2] = z;
            }
        }
        if !self.grounded() || self.vertical_speed > 0.0 {
            self.pos[1] += self.vertical_speed * dt - 0.5 * GRAVITY * dt * dt;
            self.vertical_speed -= GRAVITY * dt;
            if self.pos[1] <= 0.0 {
                self.pos[1] = 0.0;
                self.vertical_speed = 0.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    const DT: f32 = 1.0 / FPS as f32;

    fn open_arena() -> Arena {
        Arena { half_size: 100.0, obstacles: vec![] }
    }

    #[test]
    fn walks_six_metres_a_second() {
        let arena = open_arena();
        let mut c = Character::new([0.0, 0.0], 0.0);
        for _ in 0..FPS {
            c.step(&arena, DT);
        }
        assert!((c.pos[2] - 6.0).abs() < 1e-3, "{:?}", c.pos);
        assert!(c.pos[0].abs() < 1e-3);
    }

    #[test]
    fn a_jump_peaks_at_v_squared_over_2g_and_lands() {
        let arena = open_arena();
        let mut c = Character::new([0.0, 0.0], 0.0);
        c.apply(Input { forward: false, yaw: 0.0, jump: true });
        let mut peak: f32 = 0.0;
        let mut frames = 0;
        loop {
            c.step(&arena, DT);
            frames += 1;
            peak = peak.max(c.pos[1]);
            if c.grounded() {
                break;
            }
        }
        let expected = JUMP_SPEED * JUMP_SPEED / (2.0 * GRAVITY);
        assert!((peak - expected).abs() < 0.02, "peak {peak}, expected {expected}");
        let airtime = frames as f32 * DT;
        assert!((airtime - 2.0 * JUMP_SPEED / GRAVITY).abs() < 2.0 * DT, "airtime {airtime}");
        // A jump asked for in the air does nothing.
        c.pos[1] = 1.0;
        c.vertical_speed = -1.0;
        c.apply(Input { forward: false, yaw: 0.0, jump: true });
        c.step(&arena, DT);
        assert!(c.vertical_speed < 0.0);
    }

    #[test]
    fn walls_and_obstacles_stop_the_character() {
        let arena = Arena { half_size: 10.0, obstacles: vec![Aabb { min: [-1.0, 3.0], max: [1.0, 4.0] }] };
        let mut c = Character::new([0.0, 0.0], 0.0);
        for _ in 0..FPS {
            c.step(&arena, DT);
        }
        assert!(c.blocked);
        assert!(c.pos[2] < 3.0 - RADIUS + 1e-3, "stopped before the obstacle: {:?}", c.pos);
        let mut c = Character::new([5.0, 0.0], std::f32::consts::FRAC_PI_2);
        for _ in 0..FPS * 2 {
            c.step(&arena, DT);
        }
        assert!(c.blocked && c.pos[0] <= 10.0 - RADIUS, "{:?}", c.pos);
    }

    #[test]
    fn generated_arenas_have_free_spawns() {
        let mut rng = SmallRng::seed_from_u64(3);
        let arena = Arena::generate(&mut rng, 100.0, 60);
        assert_eq!(arena.obstacles.len(), 60);
        for _ in 0..100 {
            let [x, z] = arena.spawn(&mut rng);
            assert!(!arena.blocked(x, z));
        }
    }
}
