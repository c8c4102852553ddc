//! Byte-size flags (`--value-max`, `--value-size`, `--memory-per-node`, `--size`, …): one
//! parser for all of them. A size is a plain number of bytes, or a number with a unit K, M, G
//! (also KiB, MiB, GiB, KB, MB, GB, any case), all powers of 1024 as memory is counted: `64K`
//! is 65536 bytes. No flag takes a bare number in another unit than bytes.

/// The value name byte-size flags show in `--help`.
pub const VALUE_NAME: &str = "BYTES";

/// An integer type a byte-size flag parses into.
pub trait SizeType: TryFrom<u64> {
    /// Its largest value, in the message for a size that does not fit.
    const MAX: u64;
}

impl SizeType for u32 {
    const MAX: u64 = u32::MAX as u64;
}

impl SizeType for u64 {
    const MAX: u64 = u64::MAX;
}

impl SizeType for usize {
    const MAX: u64 = usize::MAX as u64;
}

/// Parse a byte size into `T` (a flag's own integer type), as a clap `value_parser`: clap
/// prefixes the error with the flag and the value given (`invalid value '12Q' for
/// '--value-max <BYTES>': 12Q: unknown unit "q" …`).
pub fn byte_size<T: SizeType>(s: &str) -> Result<T, String> {
    let n = nessie_store::geometry::parse_bytes(s).map_err(|e| e.to_string())?;
    T::try_from(n).map_err(|_| format!("{}: too large (at most {} bytes)", s.trim(), T::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Flags {
        #[arg(long, value_name = VALUE_NAME, value_parser = byte_size::<u32>)]
        value_max: Option<u32>,
        #[arg(long, value_name = VALUE_NAME, value_parser = byte_size::<u64>)]
        memory: Option<u64>,
    }

    fn parse(args: &[&str]) -> Result<Flags, String> {
        Flags::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(byte_size::<u32>("4096"), Ok(4096));
        assert_eq!(byte_size::<u32>("4K"), Ok(4096));
        assert_eq!(byte_size::<u32>("4KiB"), Ok(4096));
        assert_eq!(byte_size::<u32>("4kb"), Ok(4096));
        assert_eq!(byte_size::<u64>("3M"), Ok(3 << 20));
        assert_eq!(byte_size::<u64>("3MiB"), Ok(3 << 20));
        assert_eq!(byte_size::<u64>("2G"), Ok(2 << 30));
        assert_eq!(byte_size::<u64>("2GiB"), Ok(2 << 30));
        assert_eq!(byte_size::<usize>("0"), Ok(0));
        let f = parse(&["--value-max", "16K", "--memory", "1GiB"]).unwrap();
        assert_eq!(f.value_max, Some(16384));
        assert_eq!(f.memory, Some(1 << 30));
    }

    #[test]
    fn bad_sizes_say_what_is_wrong() {
        let e = |s: &str| byte_size::<u32>(s).unwrap_err();
        assert!(e("12Q").starts_with("12Q: unknown unit"), "{}", e("12Q"));
        assert!(e("").starts_with("empty"));
        assert!(e("-1").starts_with("-1: negative"));
        assert!(e("K").starts_with("K: not a byte count"));
        assert_eq!(
            e("4G"),
            format!("4G: too large (at most {} bytes)", u32::MAX)
        );
        assert_eq!(
            byte_size::<u64>("99999999999G").unwrap_err(),
            "99999999999G: too large"
        );
    }

    #[test]
    fn clap_names_the_flag_and_the_problem() {
        let e = parse(&["--value-max", "12Q"]).unwrap_err();
        assert!(
            e.contains("'--value-max <BYTES>'") && e.contains("12Q: unknown unit"),
            "{e}"
        );
        let e = parse(&["--memory=-5M"]).unwrap_err();
        assert!(e.contains("-5M: negative"), "{e}");
        let e = parse(&["--value-max", "5G"]).unwrap_err();
        assert!(e.contains("too large"), "{e}");
    }
}
