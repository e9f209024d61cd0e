//! Pods and pod resources: who a claimed slot belongs to, and when it is
//! released.

use super::*;

impl SlotAllocator {
    // ----- pods ----------------------------------------------------------

    /// A pod watch event (Added, Modified, or Deleted with `pod.deleted`).
    ///
    /// A live pod is recorded (and pod-resources entries waiting for it are
    /// applied). A pod that is deleted or in a terminal phase releases its
    /// slots at once: each slot it holds is freed, unless an Allocate
    /// handed the slot out again since the pod was bound (kubelet gave it
    /// to the next pod): then only the pod is dropped from the claim, which
    /// stays claimed until the next pod is seen or the claim expires.
    pub fn pod_observed(&mut self, pod: &PodInfo) -> Vec<Effect> {
        let mut effects = Vec::new();
        if pod.node != self.node {
            return effects;
        }
        if pod.is_live() {
            self.pods.insert(
                pod.uid.clone(),
                PodRecord {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    live: true,
                },
            );
            let key = (pod.namespace.clone(), pod.name.clone());
            if let Some(waiting) = self.unresolved.remove(&key) {
                let pod_ref = PodRef::new(&pod.uid, &pod.namespace, &pod.name);
                for (container, slot) in waiting.uses {
                    self.bind(&slot, &pod_ref, &container, waiting.at, &mut effects);
                }
            }
        } else {
            if pod.deleted {
                self.pods.remove(&pod.uid);
            } else {
                self.pods.insert(
                    pod.uid.clone(),
                    PodRecord {
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                        live: false,
                    },
                );
            }
            self.release(&pod.uid, &mut effects);
        }
        effects
    }

    /// A full pod list of this node (watch start or re-list): pods known but
    /// missing are treated as deleted, then every listed pod as observed.
    pub fn pods_listed(&mut self, pods: &[PodInfo]) -> Vec<Effect> {
        let listed: BTreeSet<&str> = pods
            .iter()
            .filter(|p| p.node == self.node)
            .map(|p| p.uid.as_str())
            .collect();
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !listed.contains(uid.as_str()))
            .cloned()
            .collect();
        let mut effects = Vec::new();
        for uid in gone {
            self.pods.remove(&uid);
            self.release(&uid, &mut effects);
        }
        for pod in pods {
            effects.extend(self.pod_observed(pod));
        }
        effects
    }

    pub(in crate::slots) fn release(&mut self, uid: &str, effects: &mut Vec<Effect>) {
        for slot in self.slots_of(uid) {
            let Some(c) = self.claims.get_mut(&slot) else {
                continue;
            };
            match c.awaiting {
                Some(allocated) => {
                    c.holder = None;
                    c.since = allocated;
                    self.emit_write(&slot, effects);
                }
                None => self.free(&slot, effects),
            }
        }
    }

    // ----- pod resources -------------------------------------------------

    /// A full kubelet pod-resources `List`, taken at `at` (read the clock
    /// before sending the request). Replaces every entry still waiting for
    /// its pod.
    ///
    /// Also releases, at once, every pending claim (awaiting, no holder, its
    /// Allocate answered) whose slot the list does not mention at all when
    /// the list was taken at least `settle_ms` after the Allocate was
    /// answered: kubelet records a pod's devices when it receives the
    /// Allocate response and keeps them until the pod is removed, so the pod
    /// the slot was handed to is gone. Any mention of the slot keeps the
    /// claim, whatever the pod's state or resource name: an entry naming a
    /// pod the watch has not delivered, or has seen terminate, may be a new
    /// pod of that name; such claims go the usual way (bound when the pod
    /// is seen, released by its events or the pending timeout).
    pub fn podresources_listed(&mut self, pods: &[PodResources], at: Millis) -> Vec<Effect> {
        self.unresolved.clear();
        let mut effects = Vec::new();
        self.apply_podresources(pods, at, &mut effects);
        self.release_settled(pods, at, &mut effects);
        effects
    }

    /// Whether `c` is a pending claim a full list taken at `at` may release
    /// when it does not mention the slot.
    pub(in crate::slots) fn settled(&self, c: &LocalClaim, at: Millis) -> bool {
        c.plan.is_none()
            && c.holder.is_none()
            && c.awaiting.is_some()
            && c.answered
                .is_some_and(|t| at >= t && at.since(t) >= self.config.settle_ms)
    }

    pub(in crate::slots) fn release_settled(
        &mut self,
        pods: &[PodResources],
        at: Millis,
        effects: &mut Vec<Effect>,
    ) {
        let listed: BTreeSet<&str> = pods
            .iter()
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
            .flat_map(|d| &d.device_ids)
            .map(String::as_str)
            .collect();
        let gone: Vec<String> = self
            .claims
            .iter()
            .filter(|(slot, c)| !listed.contains(slot.as_str()) && self.settled(c, at))
            .map(|(slot, _)| slot.clone())
            .collect();
        for slot in gone {
            self.free(&slot, effects);
        }
    }

    /// The earliest time after `after` at which a full pod-resources list
    /// could release a pending claim by the settle rule (see
    /// [`SlotAllocator::podresources_listed`]); `None` when no pending claim
    /// is waiting for its settle time. The adapter lists then.
    pub fn next_settle(&self, after: Millis) -> Option<Millis> {
        self.claims
            .values()
            .filter(|c| c.plan.is_none() && c.holder.is_none() && c.awaiting.is_some())
            .filter_map(|c| c.answered)
            .map(|t| Millis(t.0.saturating_add(self.config.settle_ms)))
            .filter(|due| *due > after)
            .min()
    }

    /// A kubelet pod-resources `Get` for one pod, taken at `at`.
    pub fn podresources_got(&mut self, pod: &PodResources, at: Millis) -> Vec<Effect> {
        self.unresolved
            .remove(&(pod.namespace.clone(), pod.name.clone()));
        let mut effects = Vec::new();
        self.apply_podresources(std::slice::from_ref(pod), at, &mut effects);
        effects
    }

    pub(in crate::slots) fn apply_podresources(
        &mut self,
        pods: &[PodResources],
        at: Millis,
        effects: &mut Vec<Effect>,
    ) {
        let mut uses: BTreeMap<(String, String), BTreeSet<(String, String)>> = BTreeMap::new();
        for pod in pods {
            for container in &pod.containers {
                for devices in &container.devices {
                    for id in &devices.device_ids {
                        let Some((instance, _)) = parse_slot_id(id) else {
                            continue;
                        };
                        let ours = self
                            .instances
                            .get(instance)
                            .is_some_and(|i| i.resource_name == devices.resource_name);
                        if ours {
                            uses.entry((pod.namespace.clone(), pod.name.clone()))
                                .or_default()
                                .insert((container.name.clone(), id.clone()));
                        }
                    }
                }
            }
        }
        for ((namespace, name), uses) in uses {
            match self.live_uid(&namespace, &name) {
                Some(uid) => {
                    let pod_ref = PodRef::new(uid, &namespace, &name);
                    for (container, slot) in uses {
                        self.bind(&slot, &pod_ref, &container, at, effects);
                    }
                }
                None => {
                    self.unresolved
                        .insert((namespace, name), Unresolved { at, uses });
                }
            }
        }
    }

    pub(in crate::slots) fn live_uid(&self, namespace: &str, name: &str) -> Option<String> {
        self.pods
            .iter()
            .find(|(_, p)| p.live && p.namespace == namespace && p.name == name)
            .map(|(uid, _)| uid.clone())
    }

    /// kubelet (snapshot taken `at`) says `pod`'s `container` uses `slot`.
    pub(in crate::slots) fn bind(
        &mut self,
        slot: &str,
        pod: &PodRef,
        container: &str,
        at: Millis,
        effects: &mut Vec<Effect>,
    ) {
        let holder = Holder::new(pod.clone(), Some(container.to_owned()));
        let Some(c) = self.claims.get_mut(slot) else {
            // kubelet has the slot in use by a live pod but this node has no
            // claim (lost record, or expired too early): adopt it, unless
            // another node holds it.
            if self.others.contains_key(slot) {
                return;
            }
            let epoch = self.bump();
            self.claims.insert(
                slot.to_owned(),
                LocalClaim {
                    epoch,
                    holder: Some(holder),
                    since: at,
                    awaiting: None,
                    answered: None,
                    plan: None,
                    dra: None,
                },
            );
            self.emit_write(slot, effects);
            return;
        };
        if c.dra.is_some() {
            // Prepared for a DRA claim: kubelet's device manager still
            // lists a pod it handed the slot to earlier (it keeps devices
            // until the pod is removed). The claim holds it, not the pod.
            return;
        }
        let mut changed = false;
        let same = c.holder.as_ref().is_some_and(|h| h.uid() == pod.uid);
        if !same && (c.holder.is_none() || at >= c.since) {
            c.holder = Some(holder);
            c.since = at;
            changed = true;
        }
        let now_ours = c.holder.as_ref().is_some_and(|h| h.uid() == pod.uid);
        if now_ours && c.awaiting.is_some_and(|a| at >= a) && c.plan.is_none() {
            c.awaiting = None;
            changed = true;
        }
        if changed {
            self.emit_write(slot, effects);
        }
    }
}
