//! Limits as the config, runtime changes and Envoy's rules give them.

use super::*;

fn sizes() -> Vec<WindowSize> {
    vec![
        WindowSize::new(60).expect("size"),
        WindowSize::new(3600).expect("size"),
    ]
}

fn raw(algorithm: Option<&str>, limits: Vec<(i64, f64)>) -> RawLimits {
    RawLimits {
        algorithm: algorithm.map(str::to_owned),
        limits: limits
            .into_iter()
            .map(|(window_size, limit)| RawLimit {
                window_size,
                limit,
                shadow: None,
            })
            .collect(),
        gcra: None,
        count_denied: None,
        key_from: None,
        overrides: Vec::new(),
        shadow: None,
        overrun: None,
    }
}

#[test]
fn limits_are_validated_against_the_window_sizes() {
    assert_eq!(validate(raw(None, vec![]), &sizes()).expect("none"), None);
    let l = validate(raw(Some("fixed_window"), vec![(60, 5.0)]), &sizes())
        .expect("valid")
        .expect("some");
    let KeyLimits::Windows(w) = &l.default else {
        panic!("windows")
    };
    assert_eq!(w.limits()[0].algorithm, WindowAlgorithm::Fixed);
    assert_eq!(
        validate(raw(None, vec![(30, 5.0)]), &sizes())
            .expect_err("size")
            .0,
        "limits[0].window_size"
    );
    assert_eq!(
        validate(raw(None, vec![(60, 0.0)]), &sizes())
            .expect_err("limit")
            .0,
        "limits[0].limit"
    );
    assert_eq!(
        validate(raw(None, vec![(60, 1.0), (60, 2.0)]), &sizes())
            .expect_err("twice")
            .0,
        "limits[1].window_size"
    );
    assert_eq!(
        validate(raw(Some("leaky"), vec![(60, 1.0)]), &sizes())
            .expect_err("algo")
            .0,
        "algorithm"
    );
    assert_eq!(
        validate(raw(Some("gcra"), vec![]), &sizes())
            .expect_err("gcra")
            .0,
        "gcra"
    );
    assert_eq!(
        validate(raw(Some("gcra"), vec![(60, 1.0)]), &sizes())
            .expect_err("windows on gcra")
            .0,
        "limits"
    );
}

#[test]
fn overrides_replace_the_default_for_their_keys() {
    let mut r = raw(None, vec![(60, 5.0)]);
    r.overrides.push(RawOverride {
        keys: vec!["vip".into()],
        limits: vec![RawLimit {
            window_size: 60,
            limit: 50.0,
            shadow: None,
        }],
        gcra: None,
    });
    let l = validate(r, &sizes()).expect("valid").expect("some");
    let limit = |k: &str| match l.for_key(k) {
        KeyLimits::Windows(w) => w.limits()[0].limit,
        KeyLimits::Gcra(_) => panic!("windows"),
    };
    assert_eq!(limit("vip"), 50.0);
    assert_eq!(limit("anyone"), 5.0);
}

fn gcra(burst: i64, count: i64, period: &str) -> RawGcra {
    RawGcra {
        burst,
        count,
        period: period.into(),
    }
}

#[test]
fn gcra_limits_take_durations_and_overrides() {
    let mut r = raw(Some("gcra"), vec![]);
    r.gcra = Some(gcra(300, 300, "180m"));
    r.overrides.push(RawOverride {
        keys: vec!["12345678".into()],
        limits: vec![],
        gcra: Some(gcra(300, 600, "180m")),
    });
    r.key_from = Some("header:X-Api-Key".into());
    let l = validate(r, &[]).expect("valid").expect("some");
    let KeyLimits::Gcra(g) = l.for_key("12345678") else {
        panic!("gcra")
    };
    assert_eq!(g.emission_interval(), Duration::from_secs(18));
    let KeyLimits::Gcra(g) = l.for_key("other") else {
        panic!("gcra")
    };
    assert_eq!(g.emission_interval(), Duration::from_secs(36));
    assert_eq!(l.key_from, KeyFrom::Header("x-api-key".into()));

    let mut r = raw(Some("gcra"), vec![]);
    r.gcra = Some(gcra(300, 300, "three hours"));
    assert_eq!(validate(r, &[]).expect_err("period").0, "gcra.period");
    let mut r = raw(Some("gcra"), vec![]);
    r.gcra = Some(gcra(0, 300, "1h"));
    assert_eq!(validate(r, &[]).expect_err("burst").0, "gcra");
    let mut r = raw(None, vec![(60, 5.0)]);
    r.gcra = Some(gcra(1, 1, "1s"));
    assert_eq!(
        validate(r, &sizes()).expect_err("gcra on windows").0,
        "gcra"
    );
    let mut r = raw(None, vec![(60, 5.0)]);
    r.key_from = Some("cookie:x".into());
    assert_eq!(validate(r, &sizes()).expect_err("key_from").0, "key_from");
}

#[test]
fn retry_after_rounds_up() {
    assert_eq!(ceil_secs(Duration::from_millis(1500)), 2);
    assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
    assert_eq!(ceil_secs(Duration::ZERO), 0);
}
