use tern_sampling::{Rng, Sampler, SamplerConfig};
#[test]
fn bench() {
    let mut rng = Rng::new(4);
    for scale in [0.5f32, 3.0, 12.0] {
        let l: Vec<f32> = (0..128_000).map(|_| scale * ((0..4).map(|_| rng.next_f64()).sum::<f64>() as f32 - 2.0)).collect();
        let hist: Vec<u32> = (0..64).collect();
        for cfg in [SamplerConfig::default(), SamplerConfig { top_k: 0, ..Default::default() }, SamplerConfig { top_k: 0, top_p: 1.0, min_p: 0.0, ..Default::default() }, SamplerConfig::greedy()] {
            let mut s = Sampler::new(cfg.clone());
            let t = std::time::Instant::now();
            for _ in 0..200 { std::hint::black_box(s.sample(&l, &hist)); }
            eprintln!("scale {scale} k={} p={} minp={} t={}: {:?}/sample", cfg.top_k, cfg.top_p, cfg.min_p, cfg.temperature, t.elapsed() / 200);
        }
    }
}
