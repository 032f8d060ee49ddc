//! Pooling, normalization, window averaging and `dimensions`, shared by every engine.

use eeane_backend_core::{EngineError, EngineOutput, TokenBatch};

use crate::config::Pooling;

/// Pools one row of token states `[seq, dim]` over its first `len` (real) tokens.
/// Padding never reaches the result: only the first `len` rows are read.
pub fn pool(states: &[f32], dim: usize, len: usize, pooling: Pooling) -> Vec<f32> {
    let real = &states[..len * dim];
    let sum = || {
        let mut sum = vec![0f64; dim];
        for token in real.chunks_exact(dim) {
            for (s, &v) in sum.iter_mut().zip(token) {
                *s += v as f64;
            }
        }
        sum
    };
    match pooling {
        Pooling::Cls => states[..dim].to_vec(),
        Pooling::None => unreachable!("graphs that pool return pooled output, which is never pooled again"),
        Pooling::Mean => sum().into_iter().map(|s| (s / len.max(1) as f64) as f32).collect(),
        Pooling::MeanSqrtLen => sum().into_iter().map(|s| (s / (len.max(1) as f64).sqrt()) as f32).collect(),
        Pooling::Max => {
            let mut max = vec![f32::NEG_INFINITY; dim];
            for token in real.chunks_exact(dim) {
                max.iter_mut().zip(token).for_each(|(m, &v)| *m = m.max(v));
            }
            max
        }
        Pooling::LastToken => states[len.max(1) * dim - dim..len.max(1) * dim].to_vec(),
    }
}

/// Scales `v` to unit length; a zero vector stays zero.
fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

/// What a request asks of its vectors beyond the model's own `normalize`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct VectorOptions {
    /// OpenAI's `dimensions`: keep the first n values, renormalized (a
    /// Matryoshka prefix is not unit length by itself).
    pub dimensions: Option<usize>,
    /// Unit length asked of a model that does not normalize (TEI's `normalize: true`).
    pub unit_length: bool,
}

/// An input's one vector from its windows' pooled vectors (one window when
/// the input fits the model): the only place vectors are normalized.
///
/// In order: each window scaled to unit length when the model normalizes;
/// several windows averaged, and the mean scaled again (a mean of unit
/// vectors is shorter than one); `dimensions` kept and scaled again; unit
/// length asked of a model that does not normalize, last. A model that does
/// not normalize, asked for unit length and `dimensions`, is scaled twice,
/// as it was before these steps were one function: the second pass can move
/// a last bit, and served vectors stay bit for bit what they were.
pub fn finish_vector(mut windows: Vec<Vec<f32>>, model_normalizes: bool, options: VectorOptions) -> Vec<f32> {
    if model_normalizes {
        windows.iter_mut().for_each(|w| normalize(w));
    }
    let mut vector = if windows.len() == 1 {
        windows.pop().unwrap_or_default()
    } else {
        let mut mean = mean_of(&windows);
        if model_normalizes {
            normalize(&mut mean);
        }
        mean
    };
    if let Some(dims) = options.dimensions {
        vector.truncate(dims);
        normalize(&mut vector);
    }
    if options.unit_length && !model_normalizes {
        normalize(&mut vector);
    }
    vector
}

/// The element-wise mean of vectors of one length, summed in f64.
fn mean_of(vectors: &[Vec<f32>]) -> Vec<f32> {
    let dim = vectors.first().map_or(0, Vec::len);
    let mut sum = vec![0f64; dim];
    for v in vectors {
        sum.iter_mut().zip(v).for_each(|(s, &x)| *s += x as f64);
    }
    sum.into_iter().map(|s| (s / vectors.len() as f64) as f32).collect()
}

/// Pools an engine's output into one vector per row, as the engine's numbers
/// (`finish_vector` normalizes); `who` names the model and engine in the
/// error a non-finite output gets.
pub fn pool_output(output: EngineOutput, batch: &TokenBatch, pooling: Pooling, who: &str) -> Result<Vec<Vec<f32>>, EngineError> {
    let vectors: Vec<Vec<f32>> = match (output, pooling) {
        (EngineOutput::Pooled { data, dim, .. }, Pooling::None) => data.chunks_exact(dim).map(<[f32]>::to_vec).collect(),
        (EngineOutput::Hidden { data, seq, dim, .. }, pooling) if pooling != Pooling::None => {
            data.chunks_exact(seq * dim).zip(&batch.lengths).map(|(states, &len)| pool(states, dim, len, pooling)).collect()
        }
        (EngineOutput::Pooled { .. }, p) => {
            return Err(EngineError::Model(format!(
                "the graph returns pooled vectors, but the model is configured with pooling = {p:?}; use pooling = \"none\""
            )))
        }
        (EngineOutput::Hidden { .. }, _) => {
            return Err(EngineError::Model("the graph returns token states, but the model is configured with pooling = \"none\"".into()))
        }
    };
    // A NaN or infinity is never a vector the model means: fail loudly instead,
    // whatever the engine (on Core ML it means the compiled model did not run
    // on the Neural Engine: off it, its output comes back non-finite).
    if let Some(row) = vectors.iter().position(|v| v.iter().any(|x| !x.is_finite())) {
        return Err(EngineError::Inference(format!(
            "{who} produced a non-finite value (NaN or infinity) for sequence {row} of a batch of {}, so nothing is returned. \
             Likely causes: fp16 overflow (precision = \"fp16\"), a broken or mis-converted graph, or on Core ML the Neural \
             Engine not really in use",
            batch.batch
        )));
    }
    Ok(vectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_ignores_padding_rows() {
        let states = [1.0, 2.0, 3.0, 4.0, 100.0, 100.0];
        assert_eq!(pool(&states, 2, 2, Pooling::Mean), vec![2.0, 3.0]);
        assert_eq!(pool(&states, 2, 2, Pooling::Cls), vec![1.0, 2.0]);
        // Max, last token and mean over sqrt(len) read the real tokens only too.
        assert_eq!(pool(&states, 2, 2, Pooling::Max), vec![3.0, 4.0]);
        assert_eq!(pool(&[-1.0, 5.0, -3.0, 2.0, 9.0, 9.0], 2, 2, Pooling::Max), vec![-1.0, 5.0]);
        assert_eq!(pool(&states, 2, 2, Pooling::LastToken), vec![3.0, 4.0]);
        assert_eq!(pool(&states, 2, 1, Pooling::LastToken), vec![1.0, 2.0]);
        let root2 = std::f64::consts::SQRT_2;
        assert_eq!(pool(&states, 2, 2, Pooling::MeanSqrtLen), vec![(4.0 / root2) as f32, (6.0 / root2) as f32]);
    }

    #[test]
    fn windows_average_then_renormalize() {
        let none = VectorOptions::default();
        assert_eq!(finish_vector(vec![vec![0.6, 0.8]], true, none), vec![0.6, 0.8]);
        assert_eq!(finish_vector(vec![vec![3.0, 4.0]], true, none), vec![0.6, 0.8], "one window is scaled when the model normalizes");
        assert_eq!(finish_vector(vec![vec![3.0, 4.0]], false, none), vec![3.0, 4.0], "and kept as it is when it does not");
        // Each window is scaled before the mean: [2, 0] and [0, 1] weigh the same.
        let v = finish_vector(vec![vec![2.0, 0.0], vec![0.0, 1.0]], true, none);
        assert!((v[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6 && (v[1] - v[0]).abs() < 1e-7, "{v:?}");
        assert_eq!(finish_vector(vec![vec![1.0, 0.0], vec![0.0, 1.0]], false, none), vec![0.5, 0.5]);
    }

    #[test]
    fn dimensions_and_unit_length_scale_what_they_keep() {
        let dims = |n| VectorOptions { dimensions: Some(n), unit_length: false };
        let v = finish_vector(vec![vec![3.0, 4.0, 12.0]], true, dims(2));
        assert_eq!(v.len(), 2);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6, "{v:?}");
        // `dimensions` scales the prefix whether or not the model normalizes.
        let raw = finish_vector(vec![vec![3.0, 4.0, 12.0]], false, dims(2));
        assert!((raw[0] - 0.6).abs() < 1e-6 && (raw[1] - 0.8).abs() < 1e-6, "{raw:?}");
        let unit = finish_vector(vec![vec![3.0, 4.0, 12.0]], false, VectorOptions { dimensions: None, unit_length: true });
        assert!((unit.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-6, "{unit:?}");
        let zero = finish_vector(vec![vec![0.0; 3], vec![0.0; 3]], true, VectorOptions { dimensions: Some(2), unit_length: true });
        assert_eq!(zero, vec![0.0; 2], "a zero vector stays zero");
    }

    /// The three places that normalized before `finish_vector` (the engine's
    /// output, the mean of windows, the request's `dimensions` and unit
    /// length), as they were: `finish_vector` gives their bits exactly.
    fn normalized_as_before(windows: Vec<Vec<f32>>, model_normalizes: bool, options: VectorOptions) -> Vec<f32> {
        let windows: Vec<Vec<f32>> = windows
            .into_iter()
            .map(|mut w| {
                if model_normalizes {
                    normalize(&mut w);
                }
                w
            })
            .collect();
        let mut v = if windows.len() == 1 {
            windows[0].clone()
        } else {
            let mut sum = vec![0f64; windows[0].len()];
            for w in &windows {
                sum.iter_mut().zip(w).for_each(|(s, &v)| *s += v as f64);
            }
            let mut mean: Vec<f32> = sum.into_iter().map(|s| (s / windows.len() as f64) as f32).collect();
            if model_normalizes {
                normalize(&mut mean);
            }
            mean
        };
        if let Some(dims) = options.dimensions {
            v.truncate(dims);
            normalize(&mut v);
        }
        if options.unit_length && !model_normalizes {
            normalize(&mut v);
        }
        v
    }

    #[test]
    fn every_path_gives_the_bits_of_the_steps_it_replaced() {
        // Values spread over magnitudes, so that rounding differs between orders.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut value = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10f32.powi((state % 7) as i32 - 3)
        };
        for windows in [1, 2, 5] {
            for trial in 0..40 {
                let input: Vec<Vec<f32>> = (0..windows).map(|_| (0..(48 + trial)).map(|_| value()).collect()).collect();
                for model_normalizes in [false, true] {
                    for dimensions in [None, Some(1), Some(17), Some(48)] {
                        for unit_length in [false, true] {
                            let options = VectorOptions { dimensions, unit_length };
                            let got = finish_vector(input.clone(), model_normalizes, options);
                            let want = normalized_as_before(input.clone(), model_normalizes, options);
                            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(&got), bits(&want), "{windows} windows, normalizes {model_normalizes}, {options:?}");
                        }
                    }
                }
            }
        }
    }
}
