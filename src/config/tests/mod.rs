//! Config tests, by topic: every listed mistake with its located message,
//! where problems are reported, defaults, environment overrides, the
//! effective-config round trip, and how limits count and charge.

mod budgets;
mod clients;
mod defaults;
mod env;
mod limits;
mod locations;
mod metrics;
mod mistakes;
mod render;
mod server;

use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse_ok(text: &str) -> Config {
    match from_toml_str(text, "test.toml") {
        Ok(config) => config,
        Err(err) => panic!("expected a valid config, got:\n{err}"),
    }
}

fn parse_err(text: &str) -> String {
    match from_toml_str(text, "test.toml") {
        Ok(config) => panic!("expected an error, got {config:#?}"),
        Err(err) => err.to_string(),
    }
}

const LIMIT_A: &str = "[[limits]]\nname = \"a\"\ntokens_per_minute = 100\n";
