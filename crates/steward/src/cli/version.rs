//! `steward version`: the release this binary is (the workspace version,
//! which the chart's `appVersion` and the image's tag repeat) and the git
//! commit it was built from, when the build knew it.

use serde::Serialize;

/// The workspace version (Cargo.toml), the one version of a release.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit recorded by build.rs; empty when the build had no git.
const COMMIT: &str = env!("STEWARD_GIT_COMMIT");

/// Output formats of `steward version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VersionFormat {
    /// `steward 0.1.0 (commit 0123456789ab)`.
    Text,
    Json,
    Yaml,
}

#[derive(Debug, clap::Args)]
pub struct VersionArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: VersionFormat,
}

/// What `-o json|yaml` prints.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Info {
    pub version: &'static str,
    /// `null` when the build did not know it.
    pub git_commit: Option<&'static str>,
}

pub fn info() -> Info {
    Info {
        version: VERSION,
        git_commit: (!COMMIT.is_empty()).then_some(COMMIT),
    }
}

pub fn render(info: &Info, format: VersionFormat) -> anyhow::Result<String> {
    Ok(match format {
        VersionFormat::Text => match info.git_commit {
            Some(c) => format!("steward {} (commit {c})\n", info.version),
            None => format!("steward {} (commit unknown)\n", info.version),
        },
        VersionFormat::Json | VersionFormat::Yaml => {
            super::kube_view::structured(info, format == VersionFormat::Json)?
        }
    })
}

pub fn print(args: &VersionArgs) -> anyhow::Result<()> {
    print!("{}", render(&info(), args.output)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_names_the_version_and_the_commit_or_says_it_is_unknown() {
        let known = Info {
            version: "1.2.3",
            git_commit: Some("0123456789ab"),
        };
        assert_eq!(
            render(&known, VersionFormat::Text).unwrap(),
            "steward 1.2.3 (commit 0123456789ab)\n"
        );
        let unknown = Info {
            version: "1.2.3",
            git_commit: None,
        };
        assert_eq!(
            render(&unknown, VersionFormat::Text).unwrap(),
            "steward 1.2.3 (commit unknown)\n"
        );
    }

    #[test]
    fn json_has_the_version_and_a_null_commit_when_unknown() {
        let unknown = Info {
            version: "1.2.3",
            git_commit: None,
        };
        let v: serde_json::Value =
            serde_json::from_str(&render(&unknown, VersionFormat::Json).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"version": "1.2.3", "gitCommit": null})
        );
    }

    #[test]
    fn the_version_is_the_workspace_version() {
        let manifest = include_str!("../../../../Cargo.toml");
        let line = manifest
            .lines()
            .skip_while(|l| l.trim() != "[workspace.package]")
            .find(|l| l.starts_with("version"))
            .unwrap();
        assert_eq!(line, format!("version = \"{VERSION}\""));
    }
}
