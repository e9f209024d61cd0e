//! The DRA resource health stream on the wire: one thin adapter per
//! version kubelet dials, both over `health::watch`.
//!
//! * `v1alpha1.DRAResourceHealth` — kubelet 1.34–1.36 (feature gate
//!   ResourceHealthStatus), which dial it whether or not it is advertised,
//!   and kubelet 1.37 when a plugin advertises only it.
//! * `v1.DRAResourceHealth` — kubelet 1.37, preferred when advertised.
//!
//! The two carry the same messages under different packages. Typed health
//! becomes wire messages only here: Healthy/Unhealthy as the enum, the
//! reason as `message` (empty when healthy), the report's `stale_after` as
//! `health_check_timeout_seconds` (whole seconds, at least 1; kubelet 1.34
//! ignores it and uses its 30 s).

/// Generates module `$v`: the adapter `Health` for the health API in
/// `steward_proto::dra_health::$v`, and `wire`, its conversion.
macro_rules! health_adapter {
    ($v:ident) => {
        pub(crate) mod $v {
            use std::pin::Pin;
            use std::sync::Arc;

            use futures::{Stream, StreamExt};
            use steward_proto::dra_health::$v as wire;
            use tonic::{Request, Response, Status};

            use crate::claims::ClaimStore;
            use crate::dra::handover::CoreReader;
            use crate::dra::health::{DeviceHealth, Report, watch};

            pub(crate) struct Health<L, C> {
                /// The ledger, once this agent holds the node's store.
                pub core: CoreReader<L, C>,
                /// How long a stream waits for it before Unavailable
                /// (kubelet dials again 5 s later).
                pub hold: std::time::Duration,
                /// The state is sent again after this long without a change.
                pub resend: std::time::Duration,
            }

            /// A report as this version's message.
            pub(crate) fn wire(report: Report) -> wire::NodeWatchResourcesResponse {
                let timeout = super::whole_seconds(report.stale_after);
                wire::NodeWatchResourcesResponse {
                    devices: report
                        .devices
                        .into_iter()
                        .map(|((pool, device), health)| {
                            let (health, message) = match health {
                                DeviceHealth::Healthy => {
                                    (wire::HealthStatus::Healthy, String::new())
                                }
                                DeviceHealth::Unhealthy(why) => {
                                    (wire::HealthStatus::Unhealthy, why.text().into_owned())
                                }
                            };
                            wire::DeviceHealth {
                                device: Some(wire::DeviceIdentifier {
                                    pool_name: pool,
                                    device_name: device,
                                }),
                                health: health as i32,
                                last_updated_time: report.at,
                                health_check_timeout_seconds: timeout,
                                message,
                            }
                        })
                        .collect(),
                }
            }

            type HealthStream = Pin<
                Box<dyn Stream<Item = Result<wire::NodeWatchResourcesResponse, Status>> + Send>,
            >;

            #[tonic::async_trait]
            impl<L: ClaimStore, C: ClaimStore> wire::dra_resource_health_server::DraResourceHealth
                for Health<L, C>
            {
                type NodeWatchResourcesStream = HealthStream;

                async fn node_watch_resources(
                    &self,
                    _request: Request<wire::NodeWatchResourcesRequest>,
                ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                    let core = match self.core.now() {
                        Some(core) => core?,
                        None => self.core.wait(self.hold).await?,
                    };
                    let reports = watch(Arc::downgrade(&core), self.resend)
                        .map_err(|e| Status::unavailable(e.to_string()))?;
                    Ok(Response::new(Box::pin(reports.map(|r| Ok(wire(r))))))
                }
            }
        }
    };
}

/// A timeout in whole seconds, rounded up, at least 1 (0 would mean
/// kubelet's default).
fn whole_seconds(d: std::time::Duration) -> i64 {
    let up = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i64::try_from(up.max(1)).unwrap_or(i64::MAX)
}

health_adapter!(v1alpha1);
health_adapter!(v1);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use prost::Message;

    use crate::dra::health::{DeviceHealth, Report, Unhealthy};

    fn report() -> Report {
        Report {
            at: 1_700_000_000,
            stale_after: std::time::Duration::from_secs(30),
            devices: BTreeMap::from([
                (("p".to_owned(), "a".to_owned()), DeviceHealth::Healthy),
                (
                    ("p".to_owned(), "b".to_owned()),
                    DeviceHealth::Unhealthy(Unhealthy::NotPresent),
                ),
            ]),
        }
    }

    /// Both versions carry the same bytes; the unhealthy device its reason.
    #[test]
    fn both_versions_say_the_same() {
        let alpha = super::v1alpha1::wire(report()).encode_to_vec();
        let v1 = super::v1::wire(report()).encode_to_vec();
        assert_eq!(alpha, v1);
        let m = steward_proto::dra_health::v1::NodeWatchResourcesResponse::decode(v1.as_slice())
            .unwrap();
        let got: Vec<_> = m
            .devices
            .iter()
            .map(|d| {
                (
                    d.health,
                    d.message.as_str(),
                    d.last_updated_time,
                    d.health_check_timeout_seconds,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (1, "", 1_700_000_000, 30),
                (
                    2,
                    "the device is not present on this node",
                    1_700_000_000,
                    30
                )
            ]
        );
    }

    #[test]
    fn timeouts_are_whole_seconds_rounded_up() {
        use std::time::Duration;
        assert_eq!(super::whole_seconds(Duration::from_secs(30)), 30);
        assert_eq!(super::whole_seconds(Duration::from_millis(600)), 1);
        assert_eq!(super::whole_seconds(Duration::from_millis(1_500)), 2);
        assert_eq!(super::whole_seconds(Duration::ZERO), 1);
    }
}
