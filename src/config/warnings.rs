//! Advice on a valid configuration: settings that work but most likely do
//! not mean what was written. `check-config` prints them, and the daemon
//! logs them when it starts and on every reload.

use super::Config;
use crate::tokens::Provider;

impl Config {
    /// One line per setting that is valid but likely a mistake, located by
    /// the limit it belongs to.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for (index, limit) in self.limits.iter().enumerate() {
            let Some(model) = &limit.model else { continue };
            let Some(owner) = Provider::of_model(model) else {
                continue;
            };
            if owner != limit.provider {
                warnings.push(format!(
                    "limits[{index}] {:?}: model {model:?} is {}'s, but the limit uses provider = {:?}: \
                     its charge and settlement will not be the provider's, which over- or under-admits; \
                     set provider = {:?}",
                    limit.name,
                    owner.display_name(),
                    limit.provider.name(),
                    owner.name()
                ));
            }
        }
        warnings
    }
}

#[cfg(test)]
mod tests {
    use crate::config::from_toml_str;

    #[test]
    fn a_model_under_another_providers_preset_is_warned_about() {
        let config = from_toml_str(
            r#"
[[limits]]
name = "mini"
model = "gpt-4o-mini"
tokens_per_minute = 1000

[[limits]]
name = "mirrored"
provider = "openai"
model = "gpt-4o-mini"
tokens_per_minute = 1000

[[limits]]
name = "claude"
provider = "openai"
model = "claude-sonnet-4-5"
tokens_per_minute = 1000

[[limits]]
name = "local"
model = "llama-3.1-8b"
tokens_per_minute = 1000
"#,
            "test.toml",
        )
        .unwrap();
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:#?}");
        assert!(
            warnings[0].starts_with(
                "limits[0] \"mini\": model \"gpt-4o-mini\" is OpenAI's, but the limit uses provider = \"generic\""
            ),
            "{}",
            warnings[0]
        );
        assert!(warnings[0].ends_with("set provider = \"openai\""));
        assert!(
            warnings[1]
                .starts_with("limits[2] \"claude\": model \"claude-sonnet-4-5\" is Anthropic's"),
            "{}",
            warnings[1]
        );
    }
}
