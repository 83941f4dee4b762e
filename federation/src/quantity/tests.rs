use proptest::prelude::*;

use super::*;

struct Case {
    name: &'static str,
    input: &'static str,
    cpu_millis: Result<u64, ()>,
    whole: Result<u64, ()>,
}

const fn ok(name: &'static str, input: &'static str, cpu_millis: u64, whole: u64) -> Case {
    Case {
        name,
        input,
        cpu_millis: Ok(cpu_millis),
        whole: Ok(whole),
    }
}

/// Fits as a count but not in millicores.
const fn huge(name: &'static str, input: &'static str, whole: u64) -> Case {
    Case {
        name,
        input,
        cpu_millis: Err(()),
        whole: Ok(whole),
    }
}

const fn bad(name: &'static str, input: &'static str) -> Case {
    Case {
        name,
        input,
        cpu_millis: Err(()),
        whole: Err(()),
    }
}

#[test]
fn quantity_table() {
    let cases = [
        ok("milli suffix", "500m", 500, 1),
        ok("plain integer", "1", 1000, 1),
        ok("decimal fraction", "0.5", 500, 1),
        ok("leading point", ".25", 250, 1),
        ok("trailing point", "2.", 2000, 2),
        ok("plus sign", "+3", 3000, 3),
        ok("zero", "0", 0, 0),
        ok("negative zero is zero", "-0", 0, 0),
        ok("decimal kilo", "2k", 2_000_000, 2000),
        ok("decimal mega", "1M", 1_000_000_000, 1_000_000),
        ok("decimal giga", "1G", 1_000_000_000_000, 1_000_000_000),
        ok(
            "decimal tera",
            "1T",
            1_000_000_000_000_000,
            1_000_000_000_000,
        ),
        huge("decimal exa", "1E", 1_000_000_000_000_000_000),
        ok("kibi", "512Ki", 512 * 1024 * 1000, 512 * 1024),
        ok("mebi", "128Mi", (128 << 20) * 1000, 128 << 20),
        ok("gibi fraction", "1.5Gi", 1_610_612_736_000, 1_610_612_736),
        ok("tebi", "1Ti", (1u64 << 40) * 1000, 1 << 40),
        huge("exbi", "2Ei", 2 << 60),
        ok("exponent", "1e3", 1_000_000, 1000),
        ok("upper exponent", "1E3", 1_000_000, 1000),
        ok("negative exponent", "25e-2", 250, 1),
        ok("plus exponent", "1e+2", 100_000, 100),
        ok("nano rounds up", "1n", 1, 1),
        ok("micro rounds up", "1500u", 2, 1),
        ok("sub-milli rounds up", "0.1m", 1, 1),
        ok("milli fraction exact", "2.5m", 3, 1),
        ok(
            "many trailing zeros",
            "1000000000000000000000000000000000000000000e-40",
            100_000,
            100,
        ),
        ok(
            "long zero fraction",
            "1.000000000000000000000000000000000000000000",
            1000,
            1,
        ),
        ok(
            "leading zeros",
            "000000000000000000000000000000000000000000001",
            1000,
            1,
        ),
        ok("tiny exponent", "1e-999", 1, 1),
        bad("empty", ""),
        bad("only a sign", "-"),
        bad("only a point", "."),
        bad("negative", "-1"),
        bad("negative milli", "-100m"),
        bad("unknown suffix", "1Gb"),
        bad("lowercase kibi", "1ki"),
        bad("space", "1 Gi"),
        bad("two points", "1.2.3"),
        bad("suffix and exponent", "1Mie3"),
        bad("exponent without digits", "1e"),
        bad("exponent past bound", "1e1001"),
        bad("word", "lots"),
        bad("too many digits", "123456789012345678901234567890123456789"),
    ];
    for case in cases {
        assert_eq!(
            cpu_millis(case.input).map_err(|_| ()),
            case.cpu_millis,
            "{}: cpu_millis({:?})",
            case.name,
            case.input
        );
        assert_eq!(
            whole(case.input).map_err(|_| ()),
            case.whole,
            "{}: whole({:?})",
            case.name,
            case.input
        );
    }
}

#[test]
fn overflow_is_an_error_not_a_wrap() {
    assert!(matches!(whole("17Ei"), Err(QuantityError::TooLarge(_))));
    assert!(matches!(whole("1e30"), Err(QuantityError::TooLarge(_))));
    assert!(matches!(
        cpu_millis("1e17"),
        Err(QuantityError::TooLarge(_))
    ));
    assert_eq!(whole("15Ei"), Ok(15 << 60));
}

#[test]
fn errors_name_the_input() {
    let err = whole("12Q").unwrap_err().to_string();
    assert!(err.contains("\"12Q\""), "{err}");
    assert!(err.contains("suffix"), "{err}");
    let err = cpu_millis("-5").unwrap_err().to_string();
    assert!(err.contains("negative"), "{err}");
}

#[test]
fn equal_values_parse_equal() {
    let one = Quantity::parse("1").unwrap();
    for same in ["1.0", "1000m", "0.001k", "1e0", "10e-1", "01"] {
        assert_eq!(Quantity::parse(same).unwrap(), one, "{same}");
    }
}

#[test]
fn same_amounts_across_suffixes() {
    let same = |a: &str, b: &str| {
        Quantity::parse(a)
            .unwrap()
            .same_amount(&Quantity::parse(b).unwrap())
    };
    for (a, b) in [
        ("1Gi", "1024Mi"),
        ("1", "1000m"),
        ("0.5Gi", "512Mi"),
        ("1k", "1000"),
        ("1Ki", "1024"),
        ("0", "0Gi"),
        ("1.5", "1500m"),
    ] {
        assert!(same(a, b), "{a} and {b}");
        assert!(same(b, a), "{b} and {a}");
    }
    for (a, b) in [("1Gi", "1G"), ("1", "1001m"), ("1Ki", "1k"), ("0", "1n")] {
        assert!(!same(a, b), "{a} and {b}");
    }
}

fn suffixes() -> impl Strategy<Value = (&'static str, u64)> {
    prop_oneof![
        Just(("", 1u64)),
        Just(("k", 1_000)),
        Just(("M", 1_000_000)),
        Just(("G", 1_000_000_000)),
        Just(("Ki", 1 << 10)),
        Just(("Mi", 1 << 20)),
        Just(("Gi", 1 << 30)),
        Just(("e3", 1_000)),
        Just(("e0", 1)),
    ]
}

proptest! {
    /// A formatted integer with a suffix reads back as the integer times the suffix.
    #[test]
    fn formatted_integers_round_trip(n in 0u64..1_000_000_000, (suffix, factor) in suffixes()) {
        let text = format!("{n}{suffix}");
        prop_assert_eq!(whole(&text), Ok(n * factor));
    }

    /// A suffixed amount is the same amount as its plain count.
    #[test]
    fn suffixed_amounts_are_their_plain_counts(n in 0u64..1_000_000, (suffix, factor) in suffixes()) {
        let text = Quantity::parse(&format!("{n}{suffix}")).unwrap();
        let plain = Quantity::parse(&(n * factor).to_string()).unwrap();
        prop_assert!(text.same_amount(&plain));
    }

    /// Millicores formatted with `m` read back exactly, and as whole cores rounded up.
    #[test]
    fn millicores_round_trip(m in 0u64..10_000_000_000) {
        prop_assert_eq!(cpu_millis(&format!("{m}m")), Ok(m));
        prop_assert_eq!(whole(&format!("{m}m")), Ok(m.div_ceil(1000)));
    }

    /// A decimal formatted with a point reads back as its millicores.
    #[test]
    fn decimals_round_trip(int in 0u64..1_000_000, frac in 0u64..1000) {
        let text = format!("{int}.{frac:03}");
        prop_assert_eq!(cpu_millis(&text), Ok(int * 1000 + frac));
    }
}
