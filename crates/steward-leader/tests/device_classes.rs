//! `steward controller --dra-device-classes` against the API server stand-in
//! serving `resource.k8s.io/v1`: one DeviceClass per Configuration with the
//! documented name and CEL, written by the leader only, never rewritten
//! when right, put back when edited, removed with its Configuration, and a
//! class without steward's label never touched. Without the DRA API the
//! reservation decisions go on, and the class keeper stops after one warning.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use steward_api::{
    Configuration, ConfigurationSpec, Instance, InstanceSpec, PodRef, Reservation, ReservationSpec,
};
use steward_leader::deviceclass::{
    CONFIGURATION_ANNOTATION, DEVICE_CLASS_TAKEN, INSTANCE_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL,
};
use steward_leader::{ControllerConfig, run};
use steward_testing_apiserver::ApiServer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);
const CLASSES: &str = "deviceclasses.resource.k8s.io";

struct Controller {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Controller {
    /// A replica as `identity`, calling the API as user `identity`.
    fn start(api: &ApiServer, identity: &str, device_classes: bool) -> Self {
        let mut cfg = ControllerConfig::new("steward-system", identity);
        cfg.device_classes = device_classes;
        cfg.resync = Duration::from_millis(100);
        // Long enough that a loaded machine does not see a failover: the
        // test asks which replica wrote.
        cfg.lease.lease_duration = Duration::from_secs(30);
        cfg.lease.renew_deadline = Duration::from_secs(20);
        cfg.lease.retry_period = Duration::from_millis(100);
        let stop = CancellationToken::new();
        let client = api.client_as(identity).unwrap();
        let s = stop.clone();
        let task = tokio::spawn(async move {
            run(client, cfg, s).await.unwrap();
        });
        Self { stop, task }
    }

    async fn stop(mut self) {
        self.stop.cancel();
        (&mut self.task).await.unwrap();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn setup(dra: bool) -> ApiServer {
    let api = ApiServer::start().await.unwrap();
    if dra {
        api.serve_dra();
    }
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for crd in steward_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for ns in ["steward-system", "other"] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(api.client())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    api
}

async fn configuration(api: &ApiServer, ns: &str, name: &str) {
    let c = Configuration::new(name, ConfigurationSpec::new("debug-echo", ""));
    Api::<Configuration>::namespaced(api.client(), ns)
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
}

/// A class written by hand (no steward label).
async fn foreign_class(api: &ApiServer, name: &str) -> DeviceClass {
    let c: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"team": "video"}},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"example.com\""}}]},
    }))
    .unwrap();
    Api::<DeviceClass>::all(api.client())
        .create(&PostParams::default(), &c)
        .await
        .unwrap()
}

/// Polls `f` until it gives something, within [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `name` until `ok` holds for it (`None`: absent), within [`WAIT`].
async fn class_until(
    api: &ApiServer,
    name: &str,
    what: &str,
    ok: impl Fn(Option<&DeviceClass>) -> bool,
) -> Option<DeviceClass> {
    let classes = Api::<DeviceClass>::all(api.client());
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let c = classes.get_opt(name).await.unwrap();
        if ok(c.as_ref()) {
            return c;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never {what}: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn class(api: &ApiServer, name: &str) -> DeviceClass {
    class_until(api, name, "appeared", |c| c.is_some())
        .await
        .unwrap()
}

fn expression(c: &DeviceClass) -> &str {
    let selectors = c.spec.selectors.as_deref().unwrap_or_default();
    assert_eq!(selectors.len(), 1, "{c:?}");
    &selectors[0].cel.as_ref().unwrap().expression
}

/// A sync point: Configuration `name` in `default` is created and its
/// class appears, so the controller has gone through every class sorted
/// before it (classes are written in name order) since.
async fn barrier(api: &ApiServer, name: &str) {
    configuration(api, "default", name).await;
    class(api, &format!("{name}.default.steward.dev")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_configuration_gets_its_class_written_by_the_leader_only() {
    let api = setup(true).await;
    let by_hand = foreign_class(&api, "by-hand").await;
    // Someone else's class under the very name steward would use.
    let squatted = foreign_class(&api, "mics.default.steward.dev").await;
    configuration(&api, "default", "cams").await;
    configuration(&api, "other", "cams").await;
    configuration(&api, "default", "mics").await;
    let a = Controller::start(&api, "replica-a", true);
    let b = Controller::start(&api, "replica-b", true);

    for ns in ["default", "other"] {
        let c = class(&api, &format!("cams.{ns}.steward.dev")).await;
        // The same name in two namespaces: two classes, each selecting
        // its own namespace's devices.
        assert_eq!(
            expression(&c),
            format!(
                r#"device.driver == "steward.dev" && device.attributes["steward.dev"].namespace == "{ns}" && device.attributes["steward.dev"].configuration == "cams""#
            )
        );
        assert_eq!(
            c.labels().get(MANAGED_BY_LABEL).map(String::as_str),
            Some(MANAGED_BY)
        );
        assert_eq!(
            c.annotations()
                .get(CONFIGURATION_ANNOTATION)
                .map(String::as_str),
            Some(format!("{ns}/cams").as_str())
        );
    }
    barrier(&api, "zz-sync").await;
    // The unlabelled classes are as they were written.
    let classes = Api::<DeviceClass>::all(api.client());
    for before in [&by_hand, &squatted] {
        let now = classes.get(&before.name_any()).await.unwrap();
        assert_eq!(now.resource_version(), before.resource_version());
        assert_eq!(now.spec, before.spec);
        assert!(!now.labels().contains_key(MANAGED_BY_LABEL));
    }
    // The Configuration whose class name was taken is told so.
    let warned = eventually("a DeviceClassNameTaken Event", || async {
        let events = Api::<Event>::namespaced(api.client(), "default")
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        events.into_iter().find(|e| {
            e.reason.as_deref() == Some(DEVICE_CLASS_TAKEN)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("mics")
        })
    })
    .await;
    assert_eq!(warned.type_.as_deref(), Some("Warning"));
    assert!(
        warned
            .note
            .as_deref()
            .is_some_and(|n| n.contains("mics.default.steward.dev")),
        "{warned:?}"
    );

    // Only the Lease holder wrote classes (the test's own writes carry no
    // user).
    let lease = Api::<Lease>::namespaced(api.client(), "steward-system")
        .get("steward-controller")
        .await
        .unwrap();
    let leader = lease.spec.unwrap().holder_identity.unwrap();
    let writers: Vec<String> = api
        .stats()
        .access
        .into_iter()
        .filter(|x| x.resource == "deviceclasses" && x.verb == "create" && !x.user.is_empty())
        .map(|x| x.user)
        .collect();
    assert!(!writers.is_empty());
    assert!(
        writers.iter().all(|u| *u == leader),
        "{writers:?} vs {leader}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classes_are_written_on_change_only_and_removed_with_their_configuration() {
    let api = setup(true).await;
    configuration(&api, "default", "cams").await;
    configuration(&api, "other", "cams").await;
    let c = Controller::start(&api, "replica-a", true);
    let first = class(&api, "cams.default.steward.dev").await;
    let other = class(&api, "cams.other.steward.dev").await;

    // A Configuration edited, another one added: the right classes are not
    // written again.
    let configs = Api::<Configuration>::namespaced(api.client(), "default");
    let mut cams = configs.get("cams").await.unwrap();
    cams.spec.capacity = 3;
    configs
        .replace("cams", &PostParams::default(), &cams)
        .await
        .unwrap();
    let writes = api.stats().writes_for(CLASSES);
    barrier(&api, "zz-sync").await;
    let classes = Api::<DeviceClass>::all(api.client());
    let now = classes.get("cams.default.steward.dev").await.unwrap();
    assert_eq!(now.resource_version(), first.resource_version());
    assert_eq!(
        api.stats().writes_for(CLASSES),
        writes + 1,
        "only the new class was written"
    );

    // Edited by hand: put back, the hand-added label kept.
    let mut edited = other.clone();
    edited.spec.selectors = None;
    edited
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert("team".into(), "video".into());
    classes
        .replace("cams.other.steward.dev", &PostParams::default(), &edited)
        .await
        .unwrap();
    let restored = class_until(&api, "cams.other.steward.dev", "was put back", |c| {
        c.is_some_and(|c| c.spec == other.spec)
    })
    .await
    .unwrap();
    assert_eq!(
        restored.labels().get("team").map(String::as_str),
        Some("video")
    );
    // Deleted by hand: written again.
    classes
        .delete("cams.other.steward.dev", &DeleteParams::default())
        .await
        .unwrap();
    class_until(&api, "cams.other.steward.dev", "came back", |c| {
        c.is_some_and(|c| c.metadata.uid != restored.metadata.uid && c.spec == other.spec)
    })
    .await;

    // The Configuration deleted: its class goes, the other namespace's stays.
    configs
        .delete("cams", &DeleteParams::default())
        .await
        .unwrap();
    class_until(&api, "cams.default.steward.dev", "went away", |c| {
        c.is_none()
    })
    .await;
    assert!(
        classes
            .get_opt("cams.other.steward.dev")
            .await
            .unwrap()
            .is_some()
    );
    c.stop().await;
}

/// `spec.draExtendedResources`: each Instance of the Configuration gets a
/// class with `extendedResourceName: steward.dev/<instance>` selecting its
/// devices; a new Instance gets one, a deleted one loses it, and opting out
/// removes them all while the Configuration's own class stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opted_in_configurations_get_an_extended_resource_class_per_instance() {
    let api = setup(true).await;
    let mut spec = ConfigurationSpec::new("debug-echo", "");
    spec.dra_extended_resources = true;
    let configs = Api::<Configuration>::namespaced(api.client(), "default");
    configs
        .create(&PostParams::default(), &Configuration::new("cams", spec))
        .await
        .unwrap();
    configuration(&api, "default", "mics").await;
    let instances = Api::<Instance>::namespaced(api.client(), "default");
    for (name, config) in [("cams-1", "cams"), ("mics-1", "mics")] {
        instances
            .create(&PostParams::default(), &instance(name, config))
            .await
            .unwrap();
    }
    let c = Controller::start(&api, "replica-a", true);
    let class1 = class(&api, "cams-1.default.instance.steward.dev").await;
    assert_eq!(
        class1.spec.extended_resource_name.as_deref(),
        Some("steward.dev/cams-1")
    );
    assert_eq!(
        expression(&class1),
        r#"device.driver == "steward.dev" && device.attributes["steward.dev"].namespace == "default" && device.attributes["steward.dev"].instance == "cams-1""#
    );
    assert_eq!(
        class1
            .annotations()
            .get(INSTANCE_ANNOTATION)
            .map(String::as_str),
        Some("default/cams-1")
    );
    // The Configuration's own class has no extended resource.
    let own = class(&api, "cams.default.steward.dev").await;
    assert_eq!(own.spec.extended_resource_name, None);

    // A new Instance gets its class; a deleted one loses it.
    instances
        .create(&PostParams::default(), &instance("cams-2", "cams"))
        .await
        .unwrap();
    class(&api, "cams-2.default.instance.steward.dev").await;
    instances
        .delete("cams-1", &DeleteParams::default())
        .await
        .unwrap();
    class_until(
        &api,
        "cams-1.default.instance.steward.dev",
        "went away",
        |c| c.is_none(),
    )
    .await;

    // Opting out: the Instance classes go, the Configuration's stays.
    let mut cams = configs.get("cams").await.unwrap();
    cams.spec.dra_extended_resources = false;
    configs
        .replace("cams", &PostParams::default(), &cams)
        .await
        .unwrap();
    class_until(
        &api,
        "cams-2.default.instance.steward.dev",
        "went away",
        |c| c.is_none(),
    )
    .await;
    barrier(&api, "zz-sync").await;
    let left: Vec<String> = Api::<DeviceClass>::all(api.client())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(
        left,
        [
            "cams.default.steward.dev",
            "mics.default.steward.dev",
            "zz-sync.default.steward.dev"
        ]
    );
    c.stop().await;
}

fn instance(name: &str, config: &str) -> Instance {
    Instance::new(
        name,
        InstanceSpec {
            configuration_name: config.into(),
            device_id: name.into(),
            shared: false,
            nodes: vec!["n1".into()],
            capacity: 2,
            properties: BTreeMap::new(),
            mounts: Vec::new(),
            device_specs: Vec::new(),
            cdi_name: format!("steward.dev/{config}={name}"),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_dra_api_reservations_are_still_decided() {
    let api = setup(false).await;
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    Api::<Node>::all(api.client())
        .create(&PostParams::default(), &n)
        .await
        .unwrap();
    let spec = InstanceSpec {
        configuration_name: "cams".into(),
        device_id: "cam".into(),
        shared: false,
        nodes: vec!["n1".into()],
        capacity: 1,
        properties: BTreeMap::new(),
        mounts: Vec::new(),
        device_specs: Vec::new(),
        cdi_name: String::new(),
    };
    Api::<Instance>::namespaced(api.client(), "default")
        .create(&PostParams::default(), &Instance::new("cam", spec))
        .await
        .unwrap();
    configuration(&api, "default", "cams").await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(api.client(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let spec = ReservationSpec {
        pod: PodRef {
            namespace: "default".into(),
            name: "p".into(),
            uid: pod.metadata.uid.clone().unwrap(),
        },
        slots: [("cam".to_owned(), 1)].into(),
        exclusive_cpus: 0,
        candidates: vec!["n1".into()],
        cancel: None,
    };
    let reservations = Api::<Reservation>::namespaced(api.client(), "default");
    reservations
        .create(&PostParams::default(), &Reservation::new("p", spec))
        .await
        .unwrap();
    let c = Controller::start(&api, "replica-a", true);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = reservations.get("p").await.unwrap();
        if r.status.as_ref().is_some_and(|s| s.phase == "Reserved") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never Reserved: {:?}",
            r.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.stop().await;
}

/// A cluster older than 1.34 (no `resource.k8s.io/v1`): the class keeper
/// says so once and stops, instead of failing a write every second for as
/// long as the replica leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_dra_api_the_class_keeper_stops_at_once() {
    let api = setup(false).await;
    configuration(&api, "default", "cams").await;
    let (events, _task) = steward_kube::EventSink::start(api.client(), "test", "test");
    let keeper = steward_leader::deviceclass::maintain(api.client(), events);
    tokio::time::timeout(WAIT, keeper)
        .await
        .expect("the class keeper kept trying without resource.k8s.io/v1");
    api.shutdown().await;
}
