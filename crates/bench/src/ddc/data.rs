//! The test data of the Cloud DDC benchmark suite (spec `ddc-http-api.md` section 8):
//! seeded pseudo-random blobs, their ids (IoHash), ref keys (IoHash of `ref_` + the hex id),
//! the suite's hand-built one-field object, and the "game asset" size mix of `BENCHMARKS.md`.

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use tickwire_ddc::IoHash;

/// One blob and its id: `prefix` then `bytes` (the prefix is empty but for fresh uploads, which
/// share the seeded bytes).
#[derive(Clone)]
pub struct Blob {
    pub id: IoHash,
    pub bytes: Bytes,
    pub prefix: Bytes,
}

impl Blob {
    /// The blob as a request body, without copying it.
    pub fn body(&self) -> super::load::Chunks {
        super::load::Chunks::new(vec![self.prefix.clone(), self.bytes.clone()])
    }
}

/// `count` blobs of `size` bytes, the same for the same `seed`.
pub fn blobs(seed: u64, count: usize, size: impl Fn(&mut StdRng) -> usize) -> Vec<Blob> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let mut bytes = vec![0u8; size(&mut rng)];
            rng.fill_bytes(&mut bytes);
            Blob { id: IoHash::of(&bytes), bytes: bytes.into(), prefix: Bytes::new() }
        })
        .collect()
}

/// The suite's ref key for a blob: IoHash of `b"ref_" + hex(id)`.
pub fn ref_key(id: &IoHash) -> String {
    IoHash::of(format!("ref_{}", id.to_hex()).as_bytes()).to_hex()
}

/// The suite's hand-built object: `0x02`, size, one field `payload` = a uniform array of one
/// BinaryAttachment (test vector `bench-singlefield-object-0x02`).
pub fn single_field_object(attachment: &IoHash) -> Vec<u8> {
    let mut out = vec![0x02, 0x20, 0x85, 0x07];
    out.extend_from_slice(b"payload");
    out.extend_from_slice(&[0x16, 0x01, 0x0f]);
    out.extend_from_slice(attachment.as_bytes());
    out
}

/// A game asset's size, drawn from `BENCHMARKS.md`'s mix: 25% 130 B, 6% 386 B, 4% 350 B, 3%
/// 5,136 B, 3% 65,608 B, 1% log-normal around 233 KB, 0.1% 84 MB, the rest log-normal (loc
/// 490 B, scale 13.1 KB). The log-normal shapes are not given; this uses sigma 1.0 for the
/// bulk and 0.5 for the 233 KB group.
pub fn game_asset_size(rng: &mut StdRng) -> usize {
    let roll: f64 = rng.random();
    let lognormal = |rng: &mut StdRng, median: f64, sigma: f64| {
        LogNormal::new(median.ln(), sigma).expect("valid parameters").sample(rng)
    };
    let size = match roll {
        r if r < 0.25 => 130.0,
        r if r < 0.31 => 386.0,
        r if r < 0.35 => 350.0,
        r if r < 0.38 => 5_136.0,
        r if r < 0.41 => 65_608.0,
        r if r < 0.42 => lognormal(rng, 233_000.0, 0.5),
        r if r < 0.421 => 84_000_000.0,
        _ => 490.0 + lognormal(rng, 13_100.0, 1.0),
    };
    size.min(100e6) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_is_the_vector() {
        let id: IoHash = "d00278ae47eb27b34faecf67b4fe263f82d54129".parse().unwrap();
        assert_eq!(
            hex::encode(single_field_object(&id)),
            "022085077061796c6f616416010fd00278ae47eb27b34faecf67b4fe263f82d54129"
        );
        assert!(tickwire_ddc::cb::parse(&single_field_object(&id)).is_ok());
    }

    #[test]
    fn blobs_are_reproducible_and_hashed() {
        let a = blobs(7, 3, |_| 100);
        let b = blobs(7, 3, |_| 100);
        assert_eq!(a.iter().map(|x| x.id).collect::<Vec<_>>(), b.iter().map(|x| x.id).collect::<Vec<_>>());
        assert!(a.iter().all(|x| IoHash::of(&x.bytes) == x.id && x.bytes.len() == 100));
        assert_ne!(a[0].id, a[1].id);
    }

    #[test]
    fn the_game_mix_has_its_shares() {
        let mut rng = StdRng::seed_from_u64(1);
        let sizes: Vec<usize> = (0..100_000).map(|_| game_asset_size(&mut rng)).collect();
        let share = |n: usize| sizes.iter().filter(|&&s| s == n).count() as f64 / sizes.len() as f64;
        assert!((share(130) - 0.25).abs() < 0.01, "{}", share(130));
        assert!((share(84_000_000) - 0.001).abs() < 0.0005);
    }
}
