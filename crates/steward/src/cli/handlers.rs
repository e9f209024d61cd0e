//! `steward get handlers`: the discovery handlers serving each
//! Configuration, one row per node and handler endpoint, from the
//! Configurations' status (each agent writes its node's entries), or with
//! `--state-dir` from a running standalone agent.

use serde::Serialize;
use steward_api::Configuration;

use super::Format;
use super::kube_view::{Cluster, ClusterArgs, ScopeArgs, nothing_found, structured};
use super::output::table;

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Read a running standalone agent instead of a cluster: its state
    /// directory (its read API there).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kubeconfig", "context", "all_namespaces", "namespace"])]
    state_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    scope: ScopeArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: Format,
}

/// One handler serving one Configuration on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HandlerRow {
    pub namespace: String,
    pub configuration: String,
    pub node: String,
    pub handler: String,
    pub state: String,
    pub endpoint: String,
}

/// The rows of `configs`, sorted by namespace, Configuration, node, handler.
pub fn rows(configs: &[Configuration]) -> Vec<HandlerRow> {
    let mut out: Vec<HandlerRow> = configs
        .iter()
        .flat_map(|c| {
            let namespace = c.metadata.namespace.clone().unwrap_or_default();
            let configuration = c.metadata.name.clone().unwrap_or_default();
            c.status
                .iter()
                .flat_map(|s| s.handlers.iter())
                .map(move |h| HandlerRow {
                    namespace: namespace.clone(),
                    configuration: configuration.clone(),
                    node: h.node.clone(),
                    handler: h.name.clone(),
                    state: h.state.clone(),
                    endpoint: h.endpoint.clone(),
                })
        })
        .collect();
    out.sort_by(|a, b| {
        (
            &a.namespace,
            &a.configuration,
            &a.node,
            &a.handler,
            &a.endpoint,
        )
            .cmp(&(
                &b.namespace,
                &b.configuration,
                &b.node,
                &b.handler,
                &b.endpoint,
            ))
    });
    out
}

/// The table: NAMESPACE with `-A`, ENDPOINT with `-o wide`.
pub fn render(rows: &[HandlerRow], all_namespaces: bool, wide: bool) -> String {
    let mut headers = Vec::new();
    if all_namespaces {
        headers.push("NAMESPACE");
    }
    headers.extend(["CONFIGURATION", "NODE", "HANDLER", "STATE"]);
    if wide {
        headers.push("ENDPOINT");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = Vec::new();
            if all_namespaces {
                cells.push(r.namespace.clone());
            }
            cells.extend([
                r.configuration.clone(),
                r.node.clone(),
                r.handler.clone(),
                r.state.clone(),
            ]);
            if wide {
                cells.push(r.endpoint.clone());
            }
            cells
        })
        .collect();
    table(&headers, &cells)
}

pub async fn get(args: GetArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.state_dir {
        let configs =
            super::standalone_view::configurations(dir, args.cluster.request_timeout).await?;
        let rows = rows(&configs);
        let text = match args.output {
            Format::Table | Format::Wide => {
                if rows.is_empty() {
                    eprintln!("No resources found in {}.", dir.display());
                    return Ok(());
                }
                render(&rows, true, args.output == Format::Wide)
            }
            Format::Json | Format::Yaml => structured(&rows, args.output == Format::Json)?,
        };
        print!("{text}");
        return Ok(());
    }
    let cluster = Cluster::connect(&args.cluster).await?;
    let configs: Vec<Configuration> = cluster.list(&args.scope).await?;
    let rows = rows(&configs);
    let text = match args.output {
        Format::Table | Format::Wide => {
            if rows.is_empty() {
                nothing_found(&cluster, &args.scope);
                return Ok(());
            }
            render(
                &rows,
                args.scope.all_namespaces,
                args.output == Format::Wide,
            )
        }
        Format::Json | Format::Yaml => structured(&rows, args.output == Format::Json)?,
    };
    print!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use steward_api::{ConfigurationSpec, ConfigurationStatus, HandlerStatus};

    use super::*;

    fn config(ns: &str, name: &str, handlers: &[(&str, &str, &str)]) -> Configuration {
        let mut c = Configuration::new(name, ConfigurationSpec::new("udev", ""));
        c.metadata.namespace = Some(ns.into());
        c.status = Some(ConfigurationStatus {
            handlers: handlers
                .iter()
                .map(|(node, name, state)| HandlerStatus {
                    node: (*node).into(),
                    name: (*name).into(),
                    endpoint: "embedded".into(),
                    state: (*state).into(),
                })
                .collect(),
            ..ConfigurationStatus::default()
        });
        c
    }

    #[test]
    fn one_row_per_node_and_handler_sorted() {
        let configs = vec![
            config("default", "mics", &[("node-b", "udev", "Offline")]),
            config(
                "default",
                "cams",
                &[("node-b", "udev", "Active"), ("node-a", "udev", "Waiting")],
            ),
            config("default", "empty", &[]),
        ];
        let rows = rows(&configs);
        assert_eq!(
            render(&rows, false, false),
            "CONFIGURATION   NODE     HANDLER   STATE\n\
             cams            node-a   udev      Waiting\n\
             cams            node-b   udev      Active\n\
             mics            node-b   udev      Offline\n"
        );
        let wide = render(&rows, true, true);
        assert!(wide.starts_with("NAMESPACE   CONFIGURATION"), "{wide}");
        assert!(
            wide.lines().nth(1).is_some_and(|l| l.ends_with("embedded")),
            "{wide}"
        );
    }
}
