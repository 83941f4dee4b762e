//! The CLI's standard output. A reader that goes away (`meridian status | head`) ends the
//! command quietly with success, as `cat` and `grep` do, instead of `println!`'s panic (Rust
//! ignores SIGPIPE, so the write fails with EPIPE).

use std::io::Write;

/// Writes `args` to standard output; exits at once when the reader is gone, and with an
/// error when standard output cannot be written otherwise (a full disk).
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("error: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }
}

/// `print!` through [`write`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*))
    };
}

/// `println!` through [`write`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};
