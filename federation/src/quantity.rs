//! Kubernetes resource quantities (`500m`, `1`, `0.5`, `2k`, `128Mi`, `1e3`), read exactly.
//!
//! ```text
//!  "1.5Gi" ─parse─► Quantity { mantissa: 15, exp10: -1, exp2: 30 }
//!          ─ceil_scaled(1)────► 1610612736 (bytes)
//!  "250m"  ─ceil_scaled(1000)─► 250        (millicores)
//! ```
//!
//! The grammar is apimachinery's: `<sign?><digits>[.<digits>]<suffix>` where the suffix is a
//! binary SI one (`Ki Mi Gi Ti Pi Ei`), a decimal SI one (`n u m "" k M G T P E`) or a decimal
//! exponent (`e3`, `E-2`). The number is kept as an integer mantissa with powers of ten and
//! two, so no float rounding is involved; converting rounds up, as the API server does when it
//! canonicalises a request to its smallest unit.

/// A parsed, non-negative quantity: `mantissa × 10^exp10 × 2^exp2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantity {
    mantissa: u128,
    exp10: i32,
    exp2: u32,
}

/// Why a quantity string is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error("{0:?} is not a quantity: {1}")]
    Syntax(String, &'static str),
    #[error("{0:?} is negative; a request cannot be")]
    Negative(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// The largest significant-digit count a mantissa may carry (u128 holds 38 decimal digits).
const MAX_DIGITS: usize = 38;

impl Quantity {
    /// Parses a quantity; negative ones are refused (requests and limits cannot be).
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        let syntax = |why| QuantityError::Syntax(s.to_string(), why);
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        let (negative, rest) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if int.is_empty() && frac.is_empty() {
            return Err(syntax("no digits"));
        }
        if frac.contains('.') {
            return Err(syntax("more than one decimal point"));
        }
        let (suffix_exp10, exp2) = parse_suffix(suffix).ok_or_else(|| syntax("unknown suffix"))?;
        let (mantissa, trailing) =
            digits(int, frac).ok_or_else(|| QuantityError::TooLarge(s.to_string()))?;
        if negative && mantissa != 0 {
            return Err(QuantityError::Negative(s.to_string()));
        }
        let too_long = |_| QuantityError::TooLarge(s.to_string());
        let frac_len = i32::try_from(frac.len()).map_err(too_long)?;
        let trailing = i32::try_from(trailing).map_err(too_long)?;
        Ok(Quantity {
            mantissa,
            exp10: suffix_exp10 - frac_len + trailing,
            exp2,
        }
        .normalized())
    }

    /// `⌈self × scale⌉` as a u64: `scale` 1000 gives millicores, 1 gives bytes or a count.
    pub fn ceil_scaled(&self, scale: u64) -> Option<u64> {
        let mantissa = self.mantissa.checked_mul(u128::from(scale))?;
        if mantissa == 0 {
            return Some(0);
        }
        let numerator = mantissa.checked_mul(1u128.checked_shl(self.exp2)?)?;
        let value = if self.exp10 >= 0 {
            numerator.checked_mul(10u128.checked_pow(self.exp10.unsigned_abs())?)?
        } else {
            match 10u128.checked_pow(self.exp10.unsigned_abs()) {
                Some(denominator) => numerator.div_ceil(denominator),
                // A denominator past u128 is larger than any numerator: 0 < value < 1.
                None => 1,
            }
        };
        u64::try_from(value).ok()
    }

    /// Whether two quantities are the same amount however they are written (`"1Gi"` and
    /// `"1024Mi"`, `"1"` and `"1000m"`): `==` only sees through the decimal spelling, since a
    /// power of two in the mantissa is not moved into `exp2`.
    pub fn same_amount(&self, other: &Quantity) -> bool {
        self.prime_factors() == other.prime_factors()
    }

    /// `(m, a, b)` with `self = m × 2^a × 5^b` and `m` prime to 10: one triple per amount.
    fn prime_factors(&self) -> (u128, i64, i64) {
        if self.mantissa == 0 {
            return (0, 0, 0);
        }
        let (mut m, mut twos, mut fives) = (
            self.mantissa,
            i64::from(self.exp10) + i64::from(self.exp2),
            i64::from(self.exp10),
        );
        while m.is_multiple_of(2) {
            m /= 2;
            twos += 1;
        }
        while m.is_multiple_of(5) {
            m /= 5;
            fives += 1;
        }
        (m, twos, fives)
    }

    /// Strips the mantissa's trailing zeros into the exponent, so equal values compare equal.
    fn normalized(mut self) -> Self {
        if self.mantissa == 0 {
            return Quantity {
                mantissa: 0,
                exp10: 0,
                exp2: 0,
            };
        }
        while self.mantissa.is_multiple_of(10) {
            self.mantissa /= 10;
            self.exp10 += 1;
        }
        self
    }
}

/// The mantissa of `int.frac` without its leading and trailing zeros, and how many trailing
/// zeros were dropped; None past [`MAX_DIGITS`] significant digits.
fn digits(int: &str, frac: &str) -> Option<(u128, usize)> {
    let all: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
    let significant = all
        .iter()
        .rposition(|&b| b != b'0')
        .map_or(0, |last| last + 1);
    let trailing = all.len() - significant;
    let mut mantissa = 0u128;
    for (i, b) in all[..significant]
        .iter()
        .skip_while(|&&b| b == b'0')
        .enumerate()
    {
        if i >= MAX_DIGITS {
            return None;
        }
        mantissa = mantissa * 10 + u128::from(b - b'0');
    }
    Some((mantissa, trailing))
}

/// `(power of ten, power of two)` of a suffix; None when it is none of the three kinds.
fn parse_suffix(suffix: &str) -> Option<(i32, u32)> {
    let binary = |p: u32| Some((0, p));
    match suffix {
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        "n" => Some((-9, 0)),
        "u" => Some((-6, 0)),
        "m" => Some((-3, 0)),
        "" => Some((0, 0)),
        "k" => Some((3, 0)),
        "M" => Some((6, 0)),
        "G" => Some((9, 0)),
        "T" => Some((12, 0)),
        "P" => Some((15, 0)),
        "E" => Some((18, 0)),
        _ => parse_exponent(suffix).map(|e| (e, 0)),
    }
}

/// `e<signed integer>` or `E<signed integer>`.
fn parse_exponent(suffix: &str) -> Option<i32> {
    let rest = suffix.strip_prefix(['e', 'E'])?;
    let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Exponents beyond ±1000 are refused (apimachinery bounds them far lower).
    let e: i32 = rest.parse().ok()?;
    (e.abs() <= 1000).then_some(e)
}

/// CPU in millicores, rounded up (`"0.1m"` is 1).
pub fn cpu_millis(s: &str) -> Result<u64, QuantityError> {
    let q = Quantity::parse(s)?;
    q.ceil_scaled(1000)
        .ok_or_else(|| QuantityError::TooLarge(s.to_string()))
}

/// A byte count or a plain count (`nvidia.com/gpu`), rounded up.
pub fn whole(s: &str) -> Result<u64, QuantityError> {
    let q = Quantity::parse(s)?;
    q.ceil_scaled(1)
        .ok_or_else(|| QuantityError::TooLarge(s.to_string()))
}

#[cfg(test)]
mod tests;
