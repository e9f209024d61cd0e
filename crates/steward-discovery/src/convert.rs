//! Conversions between the v0 wire messages and steward's own types. The
//! transport passes devices through unchanged: validation is the agent's job.

use std::collections::BTreeMap;

use steward_proto::discovery::v0 as proto;

use crate::{Device, DeviceSpec, DiscoverRequest, Mount};

/// A core device as a v0 message.
pub fn device_to_proto(device: &Device) -> proto::Device {
    proto::Device {
        id: device.id.clone(),
        properties: device
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        mounts: device
            .mounts
            .iter()
            .map(|m| proto::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        device_specs: device
            .device_specs
            .iter()
            .map(|s| proto::DeviceSpec {
                container_path: s.container_path.clone(),
                host_path: s.host_path.clone(),
                permissions: s.permissions.clone(),
            })
            .collect(),
    }
}

/// A v0 device as a core device.
pub fn device_from_proto(device: proto::Device) -> Device {
    Device {
        id: device.id,
        properties: device.properties.into_iter().collect::<BTreeMap<_, _>>(),
        mounts: device
            .mounts
            .into_iter()
            .map(|m| Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        device_specs: device
            .device_specs
            .into_iter()
            .map(|s| DeviceSpec {
                container_path: s.container_path,
                host_path: s.host_path,
                permissions: s.permissions,
            })
            .collect(),
    }
}

/// A request as a v0 message.
pub fn request_to_proto(req: &DiscoverRequest) -> proto::DiscoverRequest {
    proto::DiscoverRequest {
        discovery_details: req.details.clone(),
        discovery_properties: req
            .properties
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    proto::ByteData {
                        vec: Some(v.clone()),
                    },
                )
            })
            .collect(),
    }
}

/// A v0 request as ours; a property without bytes becomes an empty value.
pub fn request_from_proto(req: proto::DiscoverRequest) -> DiscoverRequest {
    DiscoverRequest {
        details: req.discovery_details,
        properties: req
            .discovery_properties
            .into_iter()
            .map(|(k, v)| (k, v.vec.unwrap_or_default()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_round_trips() {
        let device = Device {
            id: "/devices/x".into(),
            properties: BTreeMap::from([("A".into(), "1".into()), ("B".into(), "2".into())]),
            mounts: vec![Mount {
                container_path: "/c".into(),
                host_path: "/h".into(),
                read_only: true,
            }],
            device_specs: vec![DeviceSpec {
                container_path: "/dev/x".into(),
                host_path: "/dev/y".into(),
                permissions: "rw".into(),
            }],
        };
        assert_eq!(device_from_proto(device_to_proto(&device)), device);
    }

    #[test]
    fn request_round_trips_and_missing_bytes_are_empty() {
        let req = DiscoverRequest {
            details: "a: 1".into(),
            properties: BTreeMap::from([("k".into(), b"v".to_vec())]),
        };
        assert_eq!(request_from_proto(request_to_proto(&req)), req);
        let mut wire = request_to_proto(&req);
        wire.discovery_properties
            .insert("none".into(), proto::ByteData { vec: None });
        let back = request_from_proto(wire);
        assert_eq!(back.properties.get("none"), Some(&Vec::new()));
    }
}
