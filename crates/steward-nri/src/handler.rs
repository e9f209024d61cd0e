//! What a plugin does with the runtime's calls.
//!
//! The session decodes each call of the runtime's `Plugin` service and hands
//! it to a [`Handler`]; the answer goes back as the call's response. An
//! `Err(RpcStatus)` becomes an error status: on CreateContainer the runtime
//! fails the CRI call with that code and message. A call the handler does
//! not override answers an empty success, as upstream's stub does for an
//! event it has no handler for (the runtime only makes the calls subscribed
//! to in [`Handler::configure`]; Configure, Synchronize and Shutdown always).
//! Methods outside NRI v0.8.0's `Plugin` service answer `Unimplemented`
//! (see [`crate::serve`]).

use std::future::Future;

use crate::events::EventMask;
use crate::proto::nri::{
    ConfigureRequest, Container, ContainerUpdate, CreateContainerRequest, CreateContainerResponse,
    PodSandbox, StateChangeEvent, StopContainerRequest, StopContainerResponse,
    UpdateContainerRequest, UpdateContainerResponse,
};
use crate::status::RpcStatus;

/// The plugin's side of NRI, called concurrently (one task per call).
pub trait Handler: Send + Sync + 'static {
    /// The runtime's name, version, timeouts and the plugin's configuration;
    /// answers the events to subscribe to (empty: all of them).
    fn configure(
        &self,
        req: ConfigureRequest,
    ) -> impl Future<Output = Result<EventMask, RpcStatus>> + Send;

    /// Every pod and container the runtime has, once after Configure (a
    /// split Synchronize is reassembled first); answers updates to apply.
    fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> impl Future<Output = Result<Vec<ContainerUpdate>, RpcStatus>> + Send {
        let _ = (pods, containers);
        async { Ok(Vec::new()) }
    }

    /// A container is about to be created: its adjustment and updates of
    /// other containers.
    fn create_container(
        &self,
        req: CreateContainerRequest,
    ) -> impl Future<Output = Result<CreateContainerResponse, RpcStatus>> + Send {
        let _ = req;
        async { Ok(Default::default()) }
    }

    /// A container's resources are being updated.
    fn update_container(
        &self,
        req: UpdateContainerRequest,
    ) -> impl Future<Output = Result<UpdateContainerResponse, RpcStatus>> + Send {
        let _ = req;
        async { Ok(Default::default()) }
    }

    /// A container is being stopped.
    fn stop_container(
        &self,
        req: StopContainerRequest,
    ) -> impl Future<Output = Result<StopContainerResponse, RpcStatus>> + Send {
        let _ = req;
        async { Ok(Default::default()) }
    }

    /// A lifecycle event: RunPodSandbox, StopPodSandbox, RemovePodSandbox,
    /// StartContainer, RemoveContainer and the Post* events.
    fn state_change(
        &self,
        event: StateChangeEvent,
    ) -> impl Future<Output = Result<(), RpcStatus>> + Send {
        let _ = event;
        async { Ok(()) }
    }

    /// The runtime is shutting down (the connection closes after this).
    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}
