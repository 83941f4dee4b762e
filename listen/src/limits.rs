//! The descriptor limit: raised to the hard limit at start-up, and split between the
//! listeners so that a reserve is always left for meridian itself.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Errors of the descriptor limit.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error("cannot read RLIMIT_NOFILE")]
    Read(#[source] nix::Error),
    #[error(
        "the connection bounds ({listeners} descriptors: {detail}) and the reserve ({reserve}) exceed the descriptor limit {limit}; lower listeners' maxConnections or reservedDescriptors, or raise `ulimit -n`"
    )]
    TooMany {
        listeners: u64,
        detail: String,
        reserve: u64,
        limit: u64,
    },
    #[error(
        "the descriptor limit {limit} leaves nothing for the listeners after the reserve of {reserve}; raise `ulimit -n` or lower reservedDescriptors"
    )]
    NoRoom { limit: u64, reserve: u64 },
}

/// RLIMIT_NOFILE before and after start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorLimit {
    /// The soft limit meridian was started with.
    pub soft_before: u64,
    /// The soft limit now (the hard limit, unless raising it failed).
    pub soft: u64,
    pub hard: u64,
}

impl DescriptorLimit {
    /// Raises the soft limit to the hard one: the soft default (often 1024) is a leftover of
    /// `select(2)`, and a server holding thousands of connections needs more. A failure to
    /// raise it keeps the old limit (the bounds are computed from whatever holds).
    pub fn raise() -> Result<Self, LimitError> {
        let (soft_before, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(LimitError::Read)?;
        let soft = if soft_before < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
            hard
        } else {
            soft_before
        };
        Ok(Self {
            soft_before,
            soft,
            hard,
        })
    }
}

/// What the configuration asks for: explicit bounds, or `None` for a share of the limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requested {
    pub admin: Option<u64>,
    pub xds: Option<u64>,
    pub dns_tcp: Option<u64>,
    /// Descriptors kept for everything but listener connections (member API connections,
    /// watched files, the UDP socket, the runtime); `None` for the default.
    pub reserve: Option<u64>,
}

/// The connection bound of each listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub admin: usize,
    pub xds: usize,
    pub dns_tcp: usize,
    pub reserve: u64,
}

/// The default reserve: half the limit, at most 1024. A fleet of a hundred members with a
/// few connections each, its manifest files and the runtime fit in far less.
pub fn default_reserve(limit: u64) -> u64 {
    (limit / 2).min(1024)
}

/// Unset bounds share what the reserve and the set ones leave: xDS 3/4 (its clients are the
/// many and hold their connection for good: one descriptor each), TCP DNS 3/16 (a fallback
/// of UDP, its connections short and evicted when quiet), admin 1/16 (a scraper and a few
/// operators), each at least 1 and at most 65,536 (more than enough for one process; the
/// rest of a huge limit stays unused). At a limit of 20,000: 14,232 xDS clients.
pub fn bounds(limit: u64, requested: Requested) -> Result<Bounds, LimitError> {
    let reserve = requested.reserve.unwrap_or_else(|| default_reserve(limit));
    let set: u64 = [requested.admin, requested.xds, requested.dns_tcp]
        .iter()
        .flatten()
        .sum();
    if set + reserve > limit {
        return Err(LimitError::TooMany {
            listeners: set,
            detail: format!(
                "admin {}, xds {}, dns tcp {}",
                shown(requested.admin),
                shown(requested.xds),
                shown(requested.dns_tcp)
            ),
            reserve,
            limit,
        });
    }
    let free = limit - reserve - set;
    let unset = [requested.admin, requested.xds, requested.dns_tcp]
        .iter()
        .filter(|b| b.is_none())
        .count();
    if unset > 0 && free < unset as u64 {
        return Err(LimitError::NoRoom { limit, reserve });
    }
    let share = |requested: Option<u64>, sixteenths: u64| -> usize {
        let share_of_free = free * sixteenths / 16;
        requested.unwrap_or(share_of_free.clamp(1, 65_536)) as usize
    };
    Ok(Bounds {
        admin: share(requested.admin, 1),
        xds: share(requested.xds, 12),
        dns_tcp: share(requested.dns_tcp, 3),
        reserve,
    })
}

fn shown(b: Option<u64>) -> String {
    b.map_or_else(|| "a share".to_owned(), |b| b.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_bounds_share_what_the_reserve_leaves() {
        let b = bounds(1024, Requested::default()).unwrap();
        assert_eq!(b.reserve, 512);
        assert_eq!((b.admin, b.xds, b.dns_tcp), (32, 384, 96));
        assert!(b.admin + b.xds + b.dns_tcp + b.reserve as usize <= 1024);
    }

    #[test]
    fn a_low_limit_still_leaves_the_reserve() {
        let b = bounds(256, Requested::default()).unwrap();
        assert_eq!(b.reserve, 128);
        assert_eq!((b.admin, b.xds, b.dns_tcp), (8, 96, 24));
    }

    #[test]
    fn ten_thousand_xds_clients_fit_in_this_machine_s_twenty_thousand() {
        let b = bounds(20_000, Requested::default()).unwrap();
        assert_eq!((b.admin, b.xds, b.dns_tcp), (1186, 14_232, 3558));
    }

    #[test]
    fn a_huge_limit_caps_each_share() {
        let b = bounds(1 << 30, Requested::default()).unwrap();
        assert_eq!(b.reserve, 1024);
        assert_eq!((b.admin, b.xds, b.dns_tcp), (65_536, 65_536, 65_536));
    }

    #[test]
    fn explicit_bounds_win_and_the_others_share_the_rest() {
        let requested = Requested {
            xds: Some(500),
            reserve: Some(100),
            ..Requested::default()
        };
        let b = bounds(1000, requested).unwrap();
        assert_eq!(b.xds, 500);
        assert_eq!((b.admin, b.dns_tcp), (25, 75));
    }

    #[test]
    fn bounds_over_the_limit_are_an_error_that_says_what_to_do() {
        let requested = Requested {
            admin: Some(10),
            xds: Some(1000),
            ..Requested::default()
        };
        let e = bounds(1024, requested).unwrap_err().to_string();
        assert!(e.contains("exceed the descriptor limit 1024"), "{e}");
        assert!(e.contains("xds 1000"), "{e}");
        assert!(e.contains("ulimit -n"), "{e}");
    }

    #[test]
    fn a_reserve_that_takes_everything_is_an_error() {
        let requested = Requested {
            reserve: Some(1024),
            ..Requested::default()
        };
        assert!(matches!(
            bounds(1024, requested),
            Err(LimitError::NoRoom { .. })
        ));
    }
}
