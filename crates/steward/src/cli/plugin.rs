//! `kubectl steward …`: kubectl runs any executable named `kubectl-<name>`
//! found on PATH as `kubectl <name>`. Installed under that name (a symlink to
//! or a copy of this binary; scripts/release makes one), steward answers as
//! the plugin: its usage says `kubectl steward`, and only the operator
//! commands are offered (`get`, `watch`, `describe`, `explain`, `version`,
//! `crds`); the long-running components stay `steward <component>`.

use std::ffi::OsStr;
use std::path::Path;

use clap::Parser;
use clap::error::ErrorKind;

/// The executable name kubectl looks for.
pub const EXECUTABLE: &str = "kubectl-steward";

/// What usage and errors call the binary when it runs as the plugin.
const DISPLAY_NAME: &str = "kubectl steward";

/// The subcommands the plugin offers (and clap's own `help`).
pub const SUBCOMMANDS: &[&str] = &[
    "get", "watch", "describe", "explain", "version", "crds", "help",
];

/// Whether `argv0` names the plugin executable (`kubectl-steward`, with any
/// directory; kubectl runs plugins by their full path).
pub fn invoked_as_plugin(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(EXECUTABLE))
}

/// `command` as the plugin presents it: named `kubectl steward`, each
/// component subcommand hidden and lenient (so [`parse`] refuses it by
/// name, not for a flag it lacks).
pub fn as_plugin(command: clap::Command) -> clap::Command {
    let hidden: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .filter(|n| !SUBCOMMANDS.contains(&n.as_str()))
        .collect();
    let mut command = command.name(DISPLAY_NAME).bin_name(DISPLAY_NAME);
    for name in hidden {
        command = command.mut_subcommand(name, |s| {
            s.hide(true)
                .mut_args(|a| a.required(false))
                .subcommand_required(false)
                .ignore_errors(true)
        });
    }
    command
}

/// Parses the process's arguments: as `steward`, or as the plugin when
/// invoked as [`EXECUTABLE`]. Usage errors exit with clap's code 2.
pub fn parse<T: Parser>() -> T {
    let plugin = std::env::args_os()
        .next()
        .is_some_and(|argv0| invoked_as_plugin(&argv0));
    if !plugin {
        return T::parse();
    }
    let mut command = as_plugin(T::command());
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let refuse = |command: &mut clap::Command, name: &str| -> ! {
        command
            .error(
                ErrorKind::InvalidSubcommand,
                format!(
                    "`{name}` is a steward component, not a kubectl command: run it as \
                     `steward {name}` (the plugin offers {})",
                    SUBCOMMANDS[..SUBCOMMANDS.len() - 1].join(", ")
                ),
            )
            .exit()
    };
    let matches = match command.clone().try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) => match first_word(&args[1..]).filter(|w| is_component(&command, w)) {
            Some(name) => refuse(&mut command, &name),
            None => e.exit(),
        },
    };
    if let Some(name) = matches.subcommand_name()
        && !SUBCOMMANDS.contains(&name)
    {
        refuse(&mut command, name);
    }
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut command).exit())
}

/// The first argument that is not a flag (the subcommand, unless a flag
/// took a separate value before it).
fn first_word(args: &[std::ffi::OsString]) -> Option<String> {
    args.iter()
        .filter_map(|a| a.to_str())
        .find(|a| !a.starts_with('-'))
        .map(str::to_owned)
}

fn is_component(command: &clap::Command, word: &str) -> bool {
    !SUBCOMMANDS.contains(&word) && command.find_subcommand(word).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn only_the_plugin_name_is_the_plugin() {
        assert!(invoked_as_plugin(OsStr::new("kubectl-steward")));
        assert!(invoked_as_plugin(OsStr::new(
            "/usr/local/bin/kubectl-steward"
        )));
        assert!(!invoked_as_plugin(OsStr::new("steward")));
        assert!(!invoked_as_plugin(OsStr::new("/bin/kubectl-steward-old")));
        assert!(!invoked_as_plugin(OsStr::new("kubectl")));
    }

    #[derive(Debug, Parser)]
    struct Demo {
        #[command(subcommand)]
        command: DemoCommand,
    }

    #[derive(Debug, clap::Subcommand)]
    enum DemoCommand {
        Agent {
            #[arg(long)]
            node_name: String,
        },
        Get,
    }

    #[test]
    fn the_plugin_hides_the_components_and_keeps_the_operator_commands() {
        let mut command = as_plugin(Demo::command());
        assert_eq!(command.get_bin_name(), Some("kubectl steward"));
        let help = command.render_help().to_string();
        assert!(help.contains("get"), "{help}");
        assert!(!help.contains("agent"), "{help}");
        // A component parses (so `parse` can refuse it by name) even
        // without its required flags.
        let m = command
            .try_get_matches_from(["kubectl-steward", "agent"])
            .unwrap();
        assert_eq!(m.subcommand_name(), Some("agent"));
    }
}
