//! The flags of roam's daemons (roam-controller, roam-node): `--NAME VALUE` or
//! `--NAME=VALUE`, the last one given winning, each also read from the environment as
//! `ROAM_NAME` (upper case, `-` as `_`; empty counts as not set) when not on the command
//! line — so a Deployment can set either. `--version` and `--help`/`-h` stand alone.
//! Parsing is pure: what the process does with `--version` is its own.

use std::collections::BTreeMap;

/// What a command line asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Run with these flags.
    Run(Given),
    /// `--version`.
    Version,
    /// `--help` or `-h`.
    Help,
}

/// The flags given on the command line, by name (without the leading `--`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Given(BTreeMap<String, String>);

/// A command line that cannot be read: what was wrong (the caller adds its usage).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// A word that is not a flag.
    #[error("unexpected argument {0:?}")]
    Unexpected(String),
    /// A flag this program does not have.
    #[error("unknown flag --{0}")]
    Unknown(String),
    /// A flag at the end without its value.
    #[error("--{0} needs a value")]
    NoValue(String),
}

/// Read `args` (without the program's name) against the flag names `known`.
pub fn parse(args: impl IntoIterator<Item = String>, known: &[&str]) -> Result<Parsed, FlagError> {
    let mut given = BTreeMap::new();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--version" => return Ok(Parsed::Version),
            "--help" | "-h" => return Ok(Parsed::Help),
            _ => {}
        }
        let (k, v) = next_pair(a, &mut args, known)?;
        given.insert(k, v);
    }
    Ok(Parsed::Run(Given(given)))
}

/// Read a subcommand's `args` as `(name, value)` pairs in their order, against `known`: the
/// same syntax as [`parse`], without the environment, `--help` or `--version`.
pub fn pairs(
    args: impl IntoIterator<Item = String>,
    known: &[&str],
) -> Result<Vec<(String, String)>, FlagError> {
    let mut out = vec![];
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        out.push(next_pair(a, &mut args, known)?);
    }
    Ok(out)
}

/// The flag `a` and its value (after `=`, or the next word of `rest`).
fn next_pair(
    a: String,
    rest: &mut impl Iterator<Item = String>,
    known: &[&str],
) -> Result<(String, String), FlagError> {
    let Some(flag) = a.strip_prefix("--") else {
        return Err(FlagError::Unexpected(a));
    };
    let (k, v) = match flag.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (flag, None),
    };
    if !known.contains(&k) {
        return Err(FlagError::Unknown(k.to_string()));
    }
    let v = match v {
        Some(v) => v,
        None => rest
            .next()
            .ok_or_else(|| FlagError::NoValue(k.to_string()))?,
    };
    Ok((k.to_string(), v))
}

/// The environment variable that stands for flag `name`: `ROAM_` + upper case, `-` → `_`.
pub fn env_name(name: &str) -> String {
    format!("ROAM_{}", name.replace('-', "_").to_uppercase())
}

impl Given {
    /// Flag `name`: as given, else from the process's environment ([`env_name`]).
    pub fn get(&self, name: &str) -> Option<String> {
        self.get_with(name, |var| std::env::var(var).ok())
    }

    /// Flag `name`: as given, else what `env` says of its variable ([`env_name`]); an
    /// empty value counts as not set.
    pub fn get_with(&self, name: &str, env: impl Fn(&str) -> Option<String>) -> Option<String> {
        self.0
            .get(name)
            .cloned()
            .or_else(|| env(&env_name(name)).filter(|v| !v.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    const KNOWN: &[&str] = &["node-name", "pki-dir"];

    #[test]
    fn both_forms_the_last_wins_and_the_environment_fills_in() {
        let Parsed::Run(g) = parse(
            words(&["--node-name", "a", "--pki-dir=/p", "--node-name=b"]),
            KNOWN,
        )
        .unwrap() else {
            panic!("flags expected")
        };
        let env = |var: &str| {
            (var == "ROAM_PKI_DIR" || var == "ROAM_NODE_NAME").then(|| "env".to_string())
        };
        assert_eq!(g.get_with("node-name", env), Some("b".into()));
        assert_eq!(g.get_with("pki-dir", env), Some("/p".into()));
        let Parsed::Run(none) = parse(Vec::new(), KNOWN).unwrap() else {
            panic!("flags expected")
        };
        assert_eq!(none.get_with("pki-dir", env), Some("env".into()));
        assert_eq!(
            none.get_with("pki-dir", |_| Some(String::new())),
            None,
            "empty is unset"
        );
        assert_eq!(
            env_name("check-period-seconds"),
            "ROAM_CHECK_PERIOD_SECONDS"
        );
    }

    #[test]
    fn version_and_help_stand_alone() {
        assert_eq!(
            parse(words(&["--pki-dir", "/p", "--version"]), KNOWN),
            Ok(Parsed::Version)
        );
        assert_eq!(parse(words(&["-h"]), KNOWN), Ok(Parsed::Help));
        assert_eq!(
            parse(words(&["--help", "--bogus"]), KNOWN),
            Ok(Parsed::Help)
        );
    }

    #[test]
    fn what_cannot_be_read_is_named() {
        for (args, expect) in [
            (&["check"][..], "unexpected argument \"check\""),
            (&["--bogus", "x"][..], "unknown flag --bogus"),
            (&["--bogus=x"][..], "unknown flag --bogus"),
            (&["--pki-dir"][..], "--pki-dir needs a value"),
        ] {
            assert_eq!(parse(words(args), KNOWN).unwrap_err().to_string(), expect);
        }
    }

    #[test]
    fn a_subcommands_pairs_keep_their_order_and_read_no_environment() {
        assert_eq!(
            pairs(words(&["--pki-dir", "/a", "--pki-dir=/b"]), KNOWN),
            Ok(vec![
                ("pki-dir".to_string(), "/a".to_string()),
                ("pki-dir".to_string(), "/b".to_string())
            ])
        );
        assert_eq!(pairs(words(&[]), KNOWN), Ok(vec![]));
        assert_eq!(
            pairs(words(&["--help"]), KNOWN),
            Err(FlagError::Unknown("help".into()))
        );
        assert_eq!(
            pairs(words(&["--pki-dir"]), KNOWN),
            Err(FlagError::NoValue("pki-dir".into()))
        );
    }
}
