//! Workload generation: key choice (uniform or Zipf) and operation mix.

use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// How keys are drawn.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyDist {
    Uniform,
    /// Zipf with exponent `theta` (the paper uses 0.99).
    Zipf(f64),
}

impl std::str::FromStr for KeyDist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "uniform" {
            return Ok(KeyDist::Uniform);
        }
        if let Some(t) = s.strip_prefix("zipf:") {
            let theta: f64 = t
                .parse()
                .map_err(|_| format!("bad Zipf exponent {t:?} in {s:?}"))?;
            if !(theta > 0.0 && theta < 10.0) {
                return Err(format!("Zipf exponent {theta} is not in (0, 10)"));
            }
            return Ok(KeyDist::Zipf(theta));
        }
        Err(format!(
            "unknown key distribution {s:?}: use uniform or zipf:THETA"
        ))
    }
}

/// Draws key indices in `0..keys`.
pub enum KeyGen {
    Uniform(u64),
    Zipf(Zipf<f64>),
}

impl KeyGen {
    pub fn new(dist: &KeyDist, keys: u64) -> Result<Self, String> {
        if keys == 0 {
            return Err("the key space is empty".into());
        }
        Ok(match dist {
            KeyDist::Uniform => KeyGen::Uniform(keys),
            KeyDist::Zipf(t) => KeyGen::Zipf(Zipf::new(keys, *t).map_err(|e| e.to_string())?),
        })
    }

    pub fn next<R: Rng>(&self, rng: &mut R) -> u64 {
        match self {
            KeyGen::Uniform(n) => rng.gen_range(0..*n),
            // Zipf yields ranks 1..=n; rank 1 is the most popular.
            KeyGen::Zipf(z) => z.sample(rng) as u64 - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn parse() {
        assert_eq!("uniform".parse::<KeyDist>().unwrap(), KeyDist::Uniform);
        assert_eq!("zipf:0.99".parse::<KeyDist>().unwrap(), KeyDist::Zipf(0.99));
        assert!("zipf:x"
            .parse::<KeyDist>()
            .unwrap_err()
            .contains("bad Zipf"));
        assert!("zipf:-1".parse::<KeyDist>().is_err());
        assert!("normal".parse::<KeyDist>().unwrap_err().contains("unknown"));
    }

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let g = KeyGen::new(&KeyDist::Zipf(0.99), 1000).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let mut hist = vec![0u32; 1000];
        for _ in 0..100_000 {
            hist[g.next(&mut rng) as usize] += 1;
        }
        assert!(
            hist[0] > 10 * hist[500].max(1),
            "rank 0 should dominate: {} vs {}",
            hist[0],
            hist[500]
        );
        let u = KeyGen::new(&KeyDist::Uniform, 10).unwrap();
        assert!((0..1000).all(|_| u.next(&mut rng) < 10));
        assert!(KeyGen::new(&KeyDist::Uniform, 0).is_err());
    }
}
