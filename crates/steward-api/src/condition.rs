//! Standard `metav1.Condition` bookkeeping shared by every status steward writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Sets condition `type_`, keeping its `lastTransitionTime` unless its status
/// changes (a new condition takes `now`).
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Time,
) {
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = now;
        }
        c.status = status.into();
        c.reason = reason.into();
        c.message = message.into();
        c.observed_generation = generation;
        return;
    }
    conditions.push(Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: now,
    });
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    #[test]
    fn transition_time_moves_only_when_the_status_does() {
        let mut cs = Vec::new();
        set_condition(&mut cs, "Ready", "False", "A", "a", Some(1), at(10));
        set_condition(&mut cs, "Ready", "False", "B", "b", Some(2), at(20));
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, at(10));
        assert_eq!(
            (cs[0].reason.as_str(), cs[0].observed_generation),
            ("B", Some(2))
        );
        set_condition(&mut cs, "Ready", "True", "C", "c", Some(2), at(30));
        assert_eq!(cs[0].last_transition_time, at(30));
        set_condition(&mut cs, "Other", "True", "D", "d", None, at(40));
        assert_eq!(cs.len(), 2);
    }
}
