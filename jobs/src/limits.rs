//! What an enqueue may carry: the longest key and kind the job table's indexes hold, and
//! the largest payload a process enqueues.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::Error;

/// The longest dedup key, in bytes (of its UTF-8 text): 2,000.
///
/// The key is part of the unique index `jobs_live_key (kind, key)`, whose entries
/// PostgreSQL limits to 2,704 bytes (a third of a page, after compression); a key that
/// does not compress below that made the insert fail with "index row size ... exceeds
/// btree version 4 maximum 2704". A longer key is an [`Error::InvalidInput`] at
/// enqueue, and nothing is written: hash a longer natural key into one that fits.
pub const MAX_KEY_BYTES: usize = 2_000;

/// The longest kind, in bytes: 500. Kinds lead every index of the job table; with a key
/// of [`MAX_KEY_BYTES`] beside it, an index entry stays under PostgreSQL's limit.
pub const MAX_KIND_BYTES: usize = 500;

/// The largest output a handler may return, in bytes of serialized JSON: 1 MiB.
///
/// The output of a kind that keeps done rows (`retain`) is stored in its row by the
/// completion, and read whole by every operator's look at the job. A larger one fails
/// the run for good, naming its size and this limit, and nothing is stored: store large
/// results in a table of your own and return their id.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// The default of [`max_payload_bytes`]: 16 MiB of JSON.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;

static MAX_PAYLOAD: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_PAYLOAD_BYTES);

/// Sets the largest payload this process enqueues, in bytes of serialized JSON
/// (default [`DEFAULT_MAX_PAYLOAD_BYTES`], 16 MiB).
///
/// A job's payload is read whole by the runtime that claims it, several times over
/// while it is parsed and deserialized (a 100 MiB payload took a runtime to a 1 GB
/// peak), and again by every operator's look at the job. A larger payload is an
/// [`Error::InvalidInput`] at enqueue, naming its size and this limit, and nothing is
/// written. Store large data in a table of its own and enqueue its id; raise the
/// limit only if the runtimes have the memory for it. It holds for every enqueue of
/// the process from the call on.
///
/// ```
/// // Jobs of this service carry small ids only: refuse anything above 64 KiB.
/// jobs::set_max_payload_bytes(64 * 1024);
/// assert_eq!(jobs::max_payload_bytes(), 64 * 1024);
/// ```
pub fn set_max_payload_bytes(bytes: usize) {
    MAX_PAYLOAD.store(bytes, Ordering::Relaxed);
}

/// The largest payload this process enqueues, in bytes: see [`set_max_payload_bytes`].
pub fn max_payload_bytes() -> usize {
    MAX_PAYLOAD.load(Ordering::Relaxed)
}

/// The longest window of a rate an operator sets (`jobs::admin::set_limits`): 30 days.
/// The window's starts are kept in `jobs_starts` for as long as it lasts, a row per
/// claim: a longer window is a rate of its own kind of job (a periodic one).
pub const MAX_RATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Refuses a kind or key the job table's indexes cannot hold, or PostgreSQL's text
/// cannot (a NUL character), and an empty kind.
pub(crate) fn check_kind_and_key(kind: &str, key: Option<&str>) -> Result<(), Error> {
    if kind.is_empty() {
        return Err(Error::InvalidInput(
            "the kind is empty: a kind names a job type, such as `email.send`".to_owned(),
        ));
    }
    if kind.contains('\0') {
        return Err(Error::InvalidInput(format!(
            "the kind `{}` contains a NUL character, which PostgreSQL text cannot store",
            prefix(kind).escape_debug()
        )));
    }
    if kind.len() > MAX_KIND_BYTES {
        return Err(Error::InvalidInput(format!(
            "the kind `{}…` is {} bytes long: kinds may be up to {MAX_KIND_BYTES} bytes",
            prefix(kind),
            kind.len()
        )));
    }
    if let Some(key) = key
        && key.len() > MAX_KEY_BYTES
    {
        return Err(Error::InvalidInput(format!(
            "the key of a job of kind `{kind}` is {} bytes long (`{}…`): keys may be up to \
             {MAX_KEY_BYTES} bytes, what the job table's unique index holds; hash a longer \
             natural key into one that fits",
            key.len(),
            prefix(key)
        )));
    }
    Ok(())
}

/// Refuses a payload above [`max_payload_bytes`].
pub(crate) fn check_payload(kind: &str, payload: &str) -> Result<(), Error> {
    let limit = max_payload_bytes();
    if payload.len() > limit {
        return Err(Error::InvalidInput(format!(
            "the payload of a job of kind `{kind}` is {} bytes of JSON, over the limit of {limit} \
             bytes (jobs::set_max_payload_bytes): store large data in a table and enqueue its id",
            payload.len()
        )));
    }
    Ok(())
}

/// The first 40 characters of `text`, for a message.
fn prefix(text: &str) -> &str {
    match text.char_indices().nth(40) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}
