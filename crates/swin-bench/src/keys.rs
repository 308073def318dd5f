//! Key distributions: one hot key, uniform over K keys, or zipf over K keys.

use rand::Rng;
use rand_distr::Distribution;

#[derive(Debug, Clone)]
pub enum Keys {
    Hot,
    Uniform(u64),
    /// k0, k1, … k(K-1), then again: every key of a range, for sync and memory runs.
    Sequential(u64, std::sync::Arc<std::sync::atomic::AtomicU64>),
    Zipf(rand_distr::Zipf<f64>),
}

impl Keys {
    /// `hot`, `uniform:K`, `seq:K` or `zipf:K[:S]` (exponent S, default 1.0).
    pub fn parse(s: &str) -> anyhow::Result<Keys> {
        let parts: Vec<&str> = s.split(':').collect();
        let count = |p: Option<&&str>| -> anyhow::Result<u64> {
            let n: u64 = p
                .ok_or_else(|| anyhow::anyhow!("{s:?}: missing key count"))?
                .parse()?;
            anyhow::ensure!(n > 0, "{s:?}: key count must be above 0");
            Ok(n)
        };
        Ok(match parts[0] {
            "hot" => Keys::Hot,
            "uniform" => Keys::Uniform(count(parts.get(1))?),
            "seq" => Keys::Sequential(count(parts.get(1))?, Default::default()),
            "zipf" => {
                let n = count(parts.get(1))?;
                let exp: f64 = parts.get(2).map_or(Ok(1.0), |e| e.parse())?;
                Keys::Zipf(
                    rand_distr::Zipf::new(n, exp).map_err(|e| anyhow::anyhow!("{s:?}: {e}"))?,
                )
            }
            other => anyhow::bail!("{other:?}: keys are hot, uniform:K, seq:K or zipf:K[:S]"),
        })
    }

    pub fn pick(&self, rng: &mut impl Rng) -> String {
        match self {
            Keys::Hot => "hot".to_owned(),
            Keys::Uniform(n) => format!("k{}", rng.gen_range(0..*n)),
            Keys::Sequential(n, next) => {
                format!(
                    "k{}",
                    next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n
                )
            }
            Keys::Zipf(z) => format!("k{}", z.sample(rng) as u64 - 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_picks_within_range() {
        let mut rng = rand::thread_rng();
        assert_eq!(Keys::parse("hot").expect("hot").pick(&mut rng), "hot");
        let u = Keys::parse("uniform:3").expect("uniform");
        for _ in 0..100 {
            assert!(["k0", "k1", "k2"].contains(&u.pick(&mut rng).as_str()));
        }
        let z = Keys::parse("zipf:10:1.2").expect("zipf");
        for _ in 0..100 {
            let k: u64 = z.pick(&mut rng)[1..].parse().expect("number");
            assert!(k < 10);
        }
        let s = Keys::parse("seq:2").expect("seq");
        let picks: Vec<String> = (0..4).map(|_| s.pick(&mut rng)).collect();
        assert_eq!(picks, ["k0", "k1", "k0", "k1"]);
        assert!(Keys::parse("uniform:0").is_err());
        assert!(Keys::parse("gauss:5").is_err());
    }
}
