//! What the extender and the leader say to each other on `/v1/decide`.
//!
//! Request: `POST /v1/decide`, JSON [`DecideRequest`]. Answers:
//! * `200`: the pod's Reservation object, decided for this ask
//!   (`status.observedGeneration` equals its generation), or, for a new ask
//!   the leader's ledger rejects, the Reservation as it would read with no
//!   object written (no `metadata.uid`: a rejection holds nothing);
//! * `202`: not decided within the request's timeout (the ask is written;
//!   a later Filter finds the decision);
//! * `421`: this replica does not lead (ask the Lease again);
//! * `503`: leading, but not able to decide now (starting, stepping down);
//! * `422`: the ask is refused, the body saying why: out of bounds
//!   ([`crate::bounds::check`], before anything is decided or written),
//!   the Reservation of the pod's name is another existing pod's, or the
//!   API server refused the Reservation as written;
//! * `502`: the API server failed; `400`: not a `DecideRequest`.

use serde::{Deserialize, Serialize};
use steward_api::ReservationSpec;

/// The Lease annotation where the leader says where it answers
/// `/v1/decide` (`http://<address>:<port>`, or `https://` when it serves
/// TLS).
pub const ENDPOINT_ANNOTATION: &str = "steward.dev/decide-endpoint";

/// The path of the one verb.
pub const DECIDE_PATH: &str = "/v1/decide";

/// Largest request body the leader reads (5,000 candidate names fit many
/// times over).
pub const MAX_REQUEST: usize = 4 << 20;

/// One pod's ask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DecideRequest {
    /// The Reservation spec the pod asks for (`cancel` unset).
    pub spec: ReservationSpec,
    /// How long the caller waits for the decision, in milliseconds.
    pub timeout_ms: u64,
}
