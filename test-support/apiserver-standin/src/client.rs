//! Client-side helpers for tests that write through the stand-in.

use std::fmt::Debug;

use kube::Api;
use kube::api::PostParams;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How many read-modify-write rounds [`replace_with_retry`] makes.
pub const CONFLICT_ATTEMPTS: u32 = 20;

/// Read-modify-write of object `name`: get it, apply `edit`, replace it with
/// the resourceVersion that was read. A 409 Conflict starts a new round, as
/// client-go's `retry.RetryOnConflict` does: another writer (an agent
/// updating the status) may change the object between our read and our
/// write. Any other error, or a conflict in the last round, is returned.
pub async fn replace_with_retry<K, F>(
    api: &Api<K>,
    name: &str,
    mut edit: F,
) -> Result<K, kube::Error>
where
    K: Clone + Debug + Serialize + DeserializeOwned,
    F: FnMut(&mut K),
{
    let mut attempt = 1;
    loop {
        let mut object = api.get(name).await?;
        edit(&mut object);
        match api.replace(name, &PostParams::default(), &object).await {
            Err(kube::Error::Api(s)) if s.is_conflict() && attempt < CONFLICT_ATTEMPTS => {
                attempt += 1;
            }
            result => return result,
        }
    }
}
