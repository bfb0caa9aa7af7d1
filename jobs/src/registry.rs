//! What `#[derive(Job)]` and `#[jobs::handler]` register through `inventory`, and the
//! start-up checks over it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::context::{JobContext, JobError};
use crate::error::Error;
use crate::job::{Job, JobConfig};

/// A kind declared by `#[derive(Job)]`.
#[doc(hidden)]
#[derive(Debug)]
pub struct KindInfo {
    pub(crate) kind: &'static str,
    pub(crate) type_name: &'static str,
}

impl KindInfo {
    /// The registration of job type `J`.
    pub const fn of<J: Job>(type_name: &'static str) -> Self {
        KindInfo {
            kind: J::KIND,
            type_name,
        }
    }
}

inventory::collect!(KindInfo);

/// What the runtime hands a handler: the payload text and the job's context.
#[doc(hidden)]
pub struct HandlerInput {
    pub(crate) payload: String,
    pub(crate) ctx: JobContext,
}

/// A running handler.
#[doc(hidden)]
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), JobError>> + Send + 'static>>;

/// A handler registered by `#[jobs::handler]`.
#[doc(hidden)]
#[derive(Debug)]
pub struct HandlerInfo {
    pub(crate) kind: &'static str,
    pub(crate) name: &'static str,
    pub(crate) config: JobConfig,
    pub(crate) call: fn(HandlerInput) -> HandlerFuture,
    pub(crate) periodic_payload: fn() -> Option<Result<String, serde_json::Error>>,
}

impl HandlerInfo {
    /// The registration of `call` as the handler of job type `J`.
    pub const fn of<J: Job>(name: &'static str, call: fn(HandlerInput) -> HandlerFuture) -> Self {
        HandlerInfo {
            kind: J::KIND,
            name,
            config: J::CONFIG,
            call,
            periodic_payload: periodic_payload::<J>,
        }
    }
}

fn periodic_payload<J: Job>() -> Option<Result<String, serde_json::Error>> {
    J::periodic_instance().map(|job| serde_json::to_string(&job))
}

inventory::collect!(HandlerInfo);

/// Deserializes the payload into `J` and calls the handler; a payload that does not
/// deserialize fails the job permanently, naming the kind and serde's complaint.
#[doc(hidden)]
pub fn dispatch<J, F, Fut>(input: HandlerInput, handler: F) -> HandlerFuture
where
    J: Job,
    F: FnOnce(J, JobContext) -> Fut,
    Fut: Future<Output = Result<(), JobError>> + Send + 'static,
{
    match serde_json::from_str::<J>(&input.payload) {
        Ok(job) => Box::pin(handler(job, input.ctx)),
        Err(e) => {
            let message = format!(
                "the payload of this `{}` job does not deserialize into {}: {e}",
                J::KIND,
                std::any::type_name::<J>()
            );
            Box::pin(std::future::ready(Err(JobError {
                kind: crate::context::JobErrorKind::Payload(message),
            })))
        }
    }
}

/// The kinds more than one type of this binary declares, each with those types, found
/// once per process.
fn declared_twice() -> &'static BTreeMap<&'static str, Vec<&'static str>> {
    static TWICE: std::sync::OnceLock<BTreeMap<&'static str, Vec<&'static str>>> =
        std::sync::OnceLock::new();
    TWICE.get_or_init(|| {
        let mut kinds: BTreeMap<&'static str, Vec<&'static str>> = BTreeMap::new();
        for info in inventory::iter::<KindInfo> {
            kinds.entry(info.kind).or_default().push(info.type_name);
        }
        kinds.retain(|_, types| types.len() > 1);
        kinds
    })
}

/// Refuses an enqueue of `kind` when more than one type of this binary declares it:
/// the runtime would refuse to start, and a binary that only enqueues would never
/// learn of it.
pub(crate) fn check_declared_once(kind: &str) -> Result<(), Error> {
    match declared_twice().get(kind) {
        Some(types) => Err(Error::Registry(format!(
            "kind `{kind}` is declared by more than one type: {}",
            types.join(", ")
        ))),
        None => Ok(()),
    }
}

/// The handlers this binary runs, by kind, after the start-up checks.
pub(crate) fn handlers() -> Result<BTreeMap<&'static str, &'static HandlerInfo>, Error> {
    let mut problems = Vec::new();

    for (kind, types) in declared_twice() {
        problems.push(format!(
            "kind `{kind}` is declared by more than one type: {}",
            types.join(", ")
        ));
    }

    let mut by_kind: BTreeMap<&'static str, Vec<&'static HandlerInfo>> = BTreeMap::new();
    for info in inventory::iter::<HandlerInfo> {
        by_kind.entry(info.kind).or_default().push(info);
    }
    let mut handlers = BTreeMap::new();
    for (kind, infos) in by_kind {
        if infos.len() > 1 {
            let names: Vec<&str> = infos.iter().map(|i| i.name).collect();
            problems.push(format!(
                "kind `{kind}` has more than one handler: {}",
                names.join(", ")
            ));
        }
        handlers.insert(kind, infos[0]);
    }
    if handlers.is_empty() && problems.is_empty() {
        problems.push(
            "no job handler is linked into this binary: annotate an async fn with \
             #[jobs::handler], and if it lives in a crate nothing else references, \
             add `use that_crate as _;`"
                .to_owned(),
        );
    }
    if problems.is_empty() {
        Ok(handlers)
    } else {
        Err(Error::Registry(problems.join("; ")))
    }
}

/// The kinds that a `#[derive(Job)]` type declares and no handler of `handlers` runs,
/// with their types, in kind order: a runtime of this binary never runs their jobs.
pub(crate) fn unhandled(
    handlers: &BTreeMap<&'static str, &'static HandlerInfo>,
) -> Vec<&'static KindInfo> {
    let mut kinds: Vec<&'static KindInfo> = inventory::iter::<KindInfo>
        .into_iter()
        .filter(|info| !handlers.contains_key(info.kind))
        .collect();
    kinds.sort_by_key(|info| (info.kind, info.type_name));
    kinds
}
