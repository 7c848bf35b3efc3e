//! Small statistics over samples: percentiles, median, min and max.

/// The `p` quantile (0..=1) by the nearest-rank method; 0 for no samples.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() as f64 * p).ceil() as usize).clamp(1, s.len()) - 1;
    s[i]
}

/// Median (lower middle for an even count, so it is always an observed value), min, max.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(v: &[f64]) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        Summary {
            median: s[(s.len() - 1) / 2],
            min: s[0],
            max: s[s.len() - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_summaries_use_observed_values() {
        let cases: [(&[f64], f64, f64); 4] = [
            (&[], 0.5, 0.0),
            (&[3.0], 0.99, 3.0),
            (&[5.0, 1.0, 4.0, 2.0, 3.0], 0.5, 3.0),
            (
                &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0],
                0.99,
                10.0,
            ),
        ];
        for (v, p, want) in cases {
            assert_eq!(percentile(v, p), want, "percentile {p} of {v:?}");
        }
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!(
            s,
            Summary {
                median: 2.0,
                min: 1.0,
                max: 4.0
            },
            "summary of 4 samples"
        );
    }
}
